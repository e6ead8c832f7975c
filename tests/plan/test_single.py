"""fit(steps_per_call=k): k steps per dispatch equal k single steps bitwise on
CPU, a non-finite batch among them included, and resume mid-run is exact
('auto', which probes, then runs the k its rule picks: tests/plan/test_auto.py)."""

import jax
import numpy as np
import pytest

import purax
from purax import plan as plan_lib
from purax import testing
from purax.core.errors import DataError
from purax.io.checkpoint import Checkpointer
from tests.helpers import assert_bitwise, refilling
from tests.helpers_steps_per_call import batches, run, task


@pytest.mark.parametrize('k', [2, 4])
def test_k_steps_per_call_equal_k_single_steps_bitwise(k):
  single, h1 = run(1)
  multi, hk = run(k)
  assert_bitwise(multi, single)
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
  final, _ = run(4, state=restored)
  assert_bitwise(final, expected)


def test_steps_per_call_must_divide_the_cadences():
  with pytest.raises(purax.ConfigError, match='log_every: expected a multiple of steps_per_call=3'):
    run(3)


def test_a_tail_shorter_than_k_runs_as_single_steps_bitwise():
  # 10 steps at k=4: two calls of 4, then steps 8 and 9 one at a time (the
  # one-step program, not a scan of 2); the same state as 10 single steps.
  single, h1 = run(1, steps=10)
  multi, hk = run(4, steps=10)
  assert_bitwise(multi, single)
  assert [r['step'] for r in hk] == [r['step'] for r in h1] == [4, 8, 10]


def test_a_call_holds_its_own_copy_of_each_batch_from_a_refilling_loader():
  # Resumed at step 2 with k = 4 and 12 batches: steps 2-3 single (passed on as
  # they are), calls of steps 4-7 and 8-11, then the tail, steps 12-13, single.
  fresh = batches()
  out = list(plan_lib.feed.stacked(refilling(fresh), 2, 4))
  assert [isinstance(o, plan_lib.Stacked) for o in out] == [False, False, True, True, False,
                                                            False]
  for call, first in zip(out[2:4], (2, 6)):
    for key in ('x', 'y'):
      np.testing.assert_array_equal(call.batches[key],
                                    np.stack([b[key] for b in fresh[first:first + 4]]))
  assert not np.shares_memory(out[2].batches['x'], out[3].batches['x'])
  for single, batch in zip(out[4:], fresh[10:]):
    assert not np.shares_memory(single['x'], out[0]['x'])   # not the loader's buffer
    np.testing.assert_array_equal(single['x'], batch['x'])


def test_a_call_of_batches_that_differ_in_shape_or_dtype_is_a_clear_error():
  data = batches()
  for changed in ({**data[1], 'x': data[1]['x'][:, :4]},
                  {**data[1], 'y': data[1]['y'].astype(np.float32)}):
    t = task()
    state = t.init(jax.random.key(0), data[0])
    with pytest.raises(DataError, match=r'train_data batch of step 1: expected the structure, '
                                        r'shapes and dtypes of the first batch of its call of '
                                        r'steps_per_call=2'):
      purax.fit(t, state, [data[0], changed] + data[2:], steps_per_call=2, hooks=purax.hooks.standard(log_every=4, progress=False))

@pytest.mark.parametrize('k', [0, -1, 2.0, 'fast'])
def test_steps_per_call_is_an_integer_or_auto(k):
  with pytest.raises(purax.ConfigError, match='steps_per_call'):
    run(k)
