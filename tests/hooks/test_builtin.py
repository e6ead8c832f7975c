"""The Log hook (issue 29.3): the learning rate the last update applied and
any hyperparameter that changed, at every log point; the first window's
compilation reported as compile_s (steps_per_sec and the one transfer of a log
point: tests/hooks/test_window.py)."""

import jax
import numpy as np

import purax
from purax.core.optim import warmup_cosine
from tests.helpers_log import DATA, PEAK, STEPS, WARMUP, task


class SetWeightDecay:
  every, name = 6, 'set_wd'

  def __call__(self, info):
    if not info.forced:
      return purax.hooks.Output(state=purax.set_hyperparams(info.state, weight_decay=0.5))


def test_the_learning_rate_applied_and_changed_hyperparameters_at_every_log_point():
  t = task()
  state = t.init(jax.random.key(0), DATA[0])
  _, history = purax.fit(t, state, DATA, steps_per_call=1, hooks=purax.hooks.standard(
      log_every=3, progress=False) + [SetWeightDecay()])
  logs = [r for r in history if 'train/loss' in r]
  assert [r['step'] for r in logs] == [3, 6, 9, 12]
  schedule = warmup_cosine(PEAK, warmup_steps=WARMUP, total_steps=STEPS)
  # At step s the last update was the s-th: optax read its schedule at count s - 1.
  np.testing.assert_allclose([r['train/learning_rate'] for r in logs],
                             [float(schedule(s - 1)) for s in (3, 6, 9, 12)], rtol=1e-6)
  assert [r.get('train/weight_decay') for r in logs] == [None, None, 0.5, 0.5]
  # One name (issue #45): the stored peak is not logged beside the rate applied.
  assert not any('train/b1' in r or 'train/peak_learning_rate' in r for r in logs)
  # Count-based: the first window compiled the step (a compilation of its own
  # MLP), no later window did; the first throughput is not compilation.
  assert logs[0]['compile_s'] > 0 and not any('compile_s' in r for r in logs[1:])


def test_applied_learning_rate_is_the_one_optax_records_for_the_same_schedule():
  """The off-by-one against optax: inject_hyperparams stores the value its
  schedule gave the update it applied; purax.adamw's applied rate must equal it
  after every update (and 'learning_rate(opt_state)' is the next one's)."""
  import optax
  from purax.core import hparams
  schedule = warmup_cosine(PEAK, warmup_steps=WARMUP, total_steps=STEPS)
  reference = optax.inject_hyperparams(optax.sgd)(learning_rate=schedule)
  ours = purax.adamw(learning_rate=PEAK, total_steps=STEPS, warmup_steps=WARMUP)
  params = {'w': np.ones((3,), np.float32)}
  grads = {'w': np.full((3,), 0.1, np.float32)}
  holder = lambda s: purax.TrainState(step=0, params=params, model_state={}, opt_state=s,  # noqa: E731
                                      rng=None, hparams={}, loss_scale=None)

  @jax.jit
  def update(ref_state, our_state):
    _, ref_state = reference.update(grads, ref_state, params)
    _, our_state = ours.update(grads, our_state, params)
    applied = hparams.get(holder(our_state), ours, applied=True)['learning_rate']
    return ref_state, our_state, applied, ref_state.hyperparams['learning_rate']

  ref_state, our_state = reference.init(params), ours.init(params)
  assert float(hparams.get(holder(our_state), ours, applied=True)['learning_rate']) == 0.0
  pairs = []
  for _ in range(STEPS):
    ref_state, our_state, applied, recorded = update(ref_state, our_state)
    pairs.append((applied, recorded))
  np.testing.assert_allclose(*np.asarray(pairs).T, rtol=1e-6)
  assert len({float(a) for a, _ in pairs}) > 3               # the schedule moved
  np.testing.assert_allclose(ours.learning_rate(our_state), schedule(STEPS), rtol=1e-6,
                             atol=1e-9)
