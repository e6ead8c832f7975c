"""fit(steps_per_call=k): k steps per dispatch equal k single steps bitwise on
CPU, a non-finite batch among them included, and resume mid-run is exact."""

import jax
import numpy as np
import pytest

import purax
from purax import testing
from purax.io.checkpoint import Checkpointer
from purax.nn import MLP

STEPS = 12


def batches():
  out = []
  for i in range(STEPS):
    rng = np.random.default_rng(i)
    b = {'x': rng.normal(size=(8, 5)).astype(np.float32),
         'y': rng.integers(0, 3, 8).astype(np.int32)}
    if i == 5:
      b['x'][0, 0] = np.nan        # a non-finite step: skipped, counted
    out.append(b)
  return out


def task():
  return purax.Task(model=MLP(num_classes=3, features=(16,), dropout_rate=0.1),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=STEPS))


def run(k, **kw):
  t = task()
  state = kw.pop('state', None) or t.init(jax.random.key(0), batches()[0])
  return purax.fit(t, state, batches(), log_every=4, progress=False, steps_per_call=k, **kw)


def bitwise(a, b, what='state'):
  testing.assert_trees_close(a, b, testing.Tolerance(0.0, 0.0), what=what)


@pytest.mark.parametrize('k', [2, 4])
def test_k_steps_per_call_equal_k_single_steps_bitwise(k):
  single, h1 = run(1)
  multi, hk = run(k)
  bitwise(multi, single)
  logged = lambda h: [(r['step'], {n: v for n, v in r.items() if n.startswith('train/')})
                      for r in h]
  assert logged(hk) == logged(h1)
  assert sum(r['train/skipped'] for r in h1) == 1          # the NaN batch was skipped


def test_multi_step_resume_from_a_mid_run_checkpoint_is_exact(tmp_path):
  expected, _ = run(1)
  ckpt = Checkpointer(str(tmp_path / 'c'))
  stop_after = iter([False, True])                          # stop at the second call (step 8)
  half, _ = run(4, checkpointer=ckpt, checkpoint_every=4, should_stop=lambda: next(stop_after))
  ckpt.close()
  assert int(half.step) == 8
  t = task()
  restored = purax.restore_or_init(str(tmp_path / 'c'), t, jax.random.key(0), batches()[0])
  final, _ = run(4, state=restored.state, train_metrics=restored.train_metrics)
  bitwise(final, expected)


def test_steps_per_call_must_divide_the_cadences():
  with pytest.raises(purax.ConfigError, match='log_every: expected a multiple of steps_per_call=3'):
    run(3)
