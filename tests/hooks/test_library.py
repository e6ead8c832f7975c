"""The provided hooks in one process: EMA is the average of the params it
samples and is evaluable; Histograms writes TensorBoard histograms that
TensorBoard's own reader reads; the user hook of the hooks module docstring
runs as written. (Resume of each: tests/hooks/test_resume.py.)"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import purax
from purax import hooks as hooks_lib
from purax.io import writers as writers_lib
from purax.nn import MLP


def batch(i):
  rng = np.random.default_rng(i)
  return {'x': rng.normal(size=(8, 4)).astype(np.float32),
          'y': rng.integers(0, 3, 8).astype(np.int32)}


TASK = purax.Task(model=MLP(num_classes=3, features=(8,)),
                  tx=purax.adamw(learning_rate=3e-2, total_steps=20))
DATA = [batch(i) for i in range(6)]


def fresh_state():
  return jax.jit(TASK.init)(jax.random.key(0), DATA[0])


class Recorder:
  """Copies the params at its cadence (a user hook)."""

  name = 'recorder'

  def __init__(self, every):
    self.every, self.seen = every, {}

  def __call__(self, info):      # on its cadence and at the last step (the final call)
    if info.step > info.first:
      self.seen[info.step] = jax.tree.map(lambda p: np.asarray(p, np.float64), info.state.params)


# The weights of (the starting params, the samples at steps 2, 4, 6) at decay 0.75,
# by hand from each formula (EMA's docstring).
EMA_WEIGHTS = {
    'debias': (0, 9 / 37, 12 / 37, 16 / 37),         # 0.75**age / (0.75**2 + 0.75 + 1)
    'warmup': (1 / 220, 9 / 220, 45 / 220, 165 / 220),   # decay_n = 1/10, 2/11, 3/12
    None: (27 / 64, 9 / 64, 12 / 64, 16 / 64),       # 0.75**3 on the start
}


@pytest.mark.parametrize('correction', list(EMA_WEIGHTS))
def test_ema_is_the_decayed_average_of_the_sampled_params(correction):
  state = fresh_state()
  start = jax.tree.map(lambda p: np.asarray(p, np.float64), state.params)
  evaluate = lambda s: purax.evaluate(TASK, s, [DATA[0]])             # noqa: E731
  ema = hooks_lib.EMA(decay=0.75, every=2, evaluate=evaluate, correction=correction)
  recorder = Recorder(every=2)
  final, history = purax.fit(TASK, state, DATA, hooks=purax.hooks.standard(
      progress=False, eval_data=[DATA[0]], eval_every=4) + [recorder, ema])
  assert sorted(recorder.seen) == [2, 4, 6] and int(ema.arrays['count']) == 3
  weights = EMA_WEIGHTS[correction]
  assert sum(weights) == pytest.approx(1.0)
  expected = jax.tree.map(lambda *ps: sum(w * p for w, p in zip(weights, ps)),
                          start, *(recorder.seen[s] for s in (2, 4, 6)))
  # float32 arithmetic of three updates against float64: a few ulps.
  jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7),
               jax.device_get(ema.params), expected)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(ema.params))
  if correction != 'warmup':
    return
  # Evaluable: the state with the average evaluates, and differs from the last params.
  averaged = ema.state_with_average(final)
  assert jax.tree.structure(averaged) == jax.tree.structure(final)
  on_average = purax.evaluate(TASK, averaged, [DATA[0]])
  on_last = purax.evaluate(TASK, final, [DATA[0]])
  assert np.isfinite(on_average['loss']) and on_average['loss'] != on_last['loss']
  # evaluate=: eval_ema/* at the samples that fall on an evaluation (4, and 6 at the end).
  written = {r['step']: r for r in history if 'eval_ema/loss' in r}
  assert sorted(written) == [4, 6]
  assert written[6]['eval_ema/loss'] == pytest.approx(on_average['loss'], rel=1e-6)
  assert written[6]['eval_ema/accuracy'] == pytest.approx(on_average['accuracy'])


def test_ema_checks_its_settings():
  with pytest.raises(purax.ConfigError, match=r'EMA.decay: expected in \[0, 1\), got 1.0'):
    hooks_lib.EMA(decay=1.0)
  with pytest.raises(purax.ConfigError, match=r"EMA.correction: expected one of \('warmup', 'debias', None\), got 'bias'"):
    hooks_lib.EMA(correction='bias')
  with pytest.raises(purax.ConfigError, match='EMA.arrays: expected an average'):
    hooks_lib.EMA().state_with_average(fresh_state())


def test_histograms_are_read_back_by_tensorboards_event_reader(tmp_path):
  from tensorboard.backend.event_processing import event_accumulator
  writer = writers_lib.MultiWriter([writers_lib.TensorBoardWriter(str(tmp_path)),
                                    writers_lib.JsonlWriter(str(tmp_path / 'metrics.jsonl'))])
  hook = hooks_lib.Histograms(every=3, task=TASK, batch=DATA[0])
  state = fresh_state()
  recorder = Recorder(every=3)
  _, history = purax.fit(TASK, state, DATA, hooks=purax.hooks.standard(log_every=3, progress=False, writer=writer) + list([recorder, hook]))
  writer.close()
  reader = event_accumulator.EventAccumulator(
      str(tmp_path), size_guidance={event_accumulator.HISTOGRAMS: 0})
  reader.Reload()
  tags = set(reader.Tags()['histograms'])
  layers = ('Dense_0', 'Dense_1')
  assert {f'{kind}/{layer}/{leaf}' for kind in ('params', 'grads') for layer in layers
          for leaf in ('kernel', 'bias')} | {'grad_norm'} <= tags
  kernel = reader.Histograms('params/Dense_0/kernel')
  assert [e.step for e in kernel] == [3, 6]
  seen = recorder.seen[6]['Dense_0']['kernel']
  assert kernel[-1].histogram_value.num == seen.size
  assert kernel[-1].histogram_value.min == pytest.approx(seen.min(), rel=1e-6)
  assert kernel[-1].histogram_value.max == pytest.approx(seen.max(), rel=1e-6)
  # Per-layer gradient norms: the gradients the step applies at those params.
  grads = jax.jit(lambda s, b: TASK.gradients(s, b)[0])
  params6 = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), recorder.seen[6])
  at6 = fresh_state().replace(params=params6, step=jnp.int32(6))
  want = {layer: float(optax.global_norm(g)) for layer, g in
          grads(at6, DATA[0]).items()}
  last = [r for r in history if 'grad_norm/Dense_0' in r][-1]
  for layer, norm in want.items():
    assert last[f'grad_norm/{layer}'] == pytest.approx(norm, rel=1e-4)
  assert reader.Histograms('grad_norm')[-1].histogram_value.num == len(want)
  # The scalar writer took the norms and ignored the histograms.
  text = (tmp_path / 'metrics.jsonl').read_text()
  assert 'grad_norm/Dense_0' in text and 'params/Dense_0/kernel' not in text


def test_histograms_check_their_settings():
  with pytest.raises(purax.ConfigError, match='Histograms.task/batch: expected both'):
    hooks_lib.Histograms(task=TASK)
  with pytest.raises(purax.ConfigError, match='Histograms.every: expected an integer >= 1'):
    hooks_lib.Histograms(every=0)


def test_the_user_hook_of_the_module_docstring_runs_as_written():
  """The example class in purax.hooks' docstring, executed from the docstring."""
  code = re.search(r'one number of state.*?Example:\n(.*?)\n  >>> task = ', hooks_lib.__doc__,
                   re.S).group(1)
  namespace = {'optax': __import__('optax'), 'purax': purax}
  exec(compile('\n'.join(line[6:] for line in code.splitlines()), 'hooks-doc', 'exec'),
       namespace)
  hook = namespace['StopAtLoss'](target=100.0)       # any loss is below it: stops at once
  hook.every = 2
  state, history = purax.fit(TASK, fresh_state(), DATA, hooks=purax.hooks.standard(log_every=2, progress=False) + list([hook]))
  assert int(state.step) == 2 and hook.reached == 2
  assert history.end.status == 'early_stopped' and history.end.step == 2
  assert any('params/global_norm' in r for r in history)
  again = namespace['StopAtLoss'](target=0.0)
  again.load_state_dict(hook.state_dict())
  assert again.reached == 2


def assert_same_sharding(a, b, what):
  assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (
      f'{what}: sharding {a.sharding} != the params\' {b.sharding}')


def test_ema_on_a_mesh_resumes_onto_the_sharded_params(tmp_path):
  """A sharded run (FSDP on 4 devices) with an EMA, checkpointed at step 4 and
  restored (the average lands on one device, then follows the params'
  shardings) ends with the straight sharded run's average."""
  from purax import parallel
  from purax.io.checkpoint import Checkpointer
  mesh = parallel.make_mesh(data=2, fsdp=2, devices=jax.devices()[:4])
  plan = parallel.sharded(TASK, mesh, parallel.for_mesh(mesh, fsdp_min_size=8), DATA[0])
  straight = hooks_lib.EMA(decay=0.5, every=2)
  purax.fit(TASK, plan.init(jax.random.key(0)), DATA, plan=plan, hooks=purax.hooks.standard(progress=False) + list([straight]))
  first = hooks_lib.EMA(decay=0.5, every=2)
  with Checkpointer(str(tmp_path)) as ckpt:
    purax.fit(TASK, plan.init(jax.random.key(0)), DATA, steps=4, plan=plan, hooks=purax.hooks.standard(progress=False, checkpointer=ckpt) + list([first]))
  resumed = hooks_lib.EMA(decay=0.5, every=2)
  restored = purax.restore_or_init(str(tmp_path), TASK, jax.random.key(0), DATA[0], plan=plan,
                                   hooks=[resumed])
  assert int(restored.hook_arrays['ema']['count']) == 2
  final, _ = purax.fit(TASK, restored, DATA, plan=plan, hooks=purax.hooks.standard(progress=False) + list([resumed]))
  assert int(resumed.arrays['count']) == int(straight.arrays['count']) == 3
  # The average follows the params' shardings (FSDP: not a full copy per device).
  sharded_leaves = [p for p in jax.tree.leaves(final.params) if not p.sharding.is_fully_replicated]
  assert sharded_leaves
  jax.tree.map(lambda a, p: assert_same_sharding(a, p, 'ema'), resumed.params, final.params)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.params),
               jax.device_get(straight.params))


def record(step, metrics):
  """The step record a hook gets after the call that ended at ``step``."""
  return purax.hooks.StepInfo(first=step - 1, step=step, state=None, metrics=metrics)


@pytest.mark.parametrize('mode,scores', [('min', (1.0, 0.875, 0.75)), ('max', (0.25, 0.375, 0.5))])
def test_early_stopping_counts_an_improvement_of_exactly_min_delta_as_stale(mode, scores):
  """min_delta 0.25 from a best of 1.0 (max: 0.25): the next two scores improve by
  0.125 and by exactly 0.25, neither more than min_delta, so both are stale and
  patience 2 stops the run at the third evaluation, not later."""
  hook = hooks_lib.EarlyStopping(metric='loss', mode=mode, patience=2, min_delta=0.25)
  out = [hook(record(s + 1, {'eval/loss': v})) for s, v in enumerate(scores)]
  assert [dict(o.metrics) for o in out] == [{'early_stopping/stale': s} for s in (0, 1, 2)]
  assert [o.stop is not None for o in out] == [False, False, True]
  end = out[-1].stop
  assert (end.status, end.step, end.metric, end.best_step) == ('early_stopped', 3, 'eval/loss', 1)
  assert end.best == scores[0]           # the best value itself, not the score to minimise
  assert hook.best == (1.0 if mode == 'min' else -0.25)
  hook(record(4, {'eval/loss': scores[0] - 0.5 if mode == 'min' else scores[0] + 0.5}))
  assert hook.stale == 0       # an improvement of more than min_delta resets the count


def test_early_stopping_by_a_train_metric_and_its_state_belongs_to_its_rule():
  """Issue 29.7: any logged metric, the rule of keep-best; a saved best and
  count of another metric or direction are not taken over on resume."""
  hook = hooks_lib.EarlyStopping(metric='train/loss', mode='min', patience=2, every=10)
  out = [hook(record(s, {'train/loss': v})) for s, v in ((10, 1.0), (20, 0.5), (30, 0.7))]
  assert [o.metrics['early_stopping/stale'] for o in out] == [0, 0, 1]
  saved = hook.state_dict()
  assert saved == {'best': 0.5, 'stale': 1, 'best_step': 20, 'metric': 'train/loss',
                   'mode': 'min'}
  same = hooks_lib.EarlyStopping(metric='train/loss', mode='min', patience=2)
  same.load_state_dict(saved)
  assert (same.best, same.stale) == (0.5, 1)
  other = hooks_lib.EarlyStopping(metric='eval/accuracy', mode='max', patience=2)
  other.load_state_dict(saved)
  assert (other.best, other.stale) == (math.inf, 0)
  with pytest.raises(purax.ConfigError, match=r"best_mode: expected 'min' or 'max'"):
    hooks_lib.EarlyStopping(metric='train/loss', mode='lowest')
