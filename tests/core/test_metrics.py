import jax
import jax.numpy as jnp
import numpy as np

from purax.core import metrics


def test_average_merges_to_the_weighted_mean():
  a = metrics.Average.of(jnp.array([1.0, 2.0]), jnp.array([1.0, 0.0]))
  b = metrics.Average.of(jnp.array([4.0]))
  tree = metrics.merge({'m': a, 'n': metrics.Sum.of(jnp.ones(3))},
                       {'m': b, 'n': metrics.Sum.of(jnp.ones(2))})
  out = metrics.compute(tree)
  assert out == {'m': 2.5, 'n': 5.0}
  assert isinstance(out['m'], float)


def test_merge_is_jittable_and_zeros_is_identity():
  tree = {'loss': metrics.Average.of(jnp.arange(4.0)), 'examples': metrics.Sum.of(jnp.ones(4))}
  zero = metrics.zeros_like(tree)
  merged = jax.jit(metrics.merge)(zero, tree)
  assert metrics.compute(merged) == metrics.compute(tree)
  abstract = jax.eval_shape(lambda: tree)
  assert metrics.compute(metrics.merge(metrics.zeros_like(abstract), tree)) == \
      metrics.compute(tree)


def test_empty_average_is_nan_and_stacked_metrics_come_back_as_arrays():
  assert np.isnan(metrics.compute({'a': metrics.Average(jnp.float32(0), jnp.float32(0))})['a'])
  stacked = jax.vmap(lambda v: {'a': metrics.Average.of(v)})(jnp.arange(6.0).reshape(3, 2))
  np.testing.assert_allclose(metrics.compute(stacked)['a'], [0.5, 2.5, 4.5])


def test_a_streak_counts_the_longest_run_of_consecutive_flagged_steps():
  """Flags 1 1 0 1 1 1 0 1, merged step by step: the longest run is 3 and the
  window ends on a run of 1 (a run that crosses a log point stays whole)."""
  from purax.core.metrics import Streak
  acc = Streak.of(False)
  for flag in [1, 1, 0, 1, 1, 1, 0, 1]:
    acc = acc.merge(Streak.of(bool(flag)))
  assert int(acc.longest) == 3 and int(acc.current) == 1
  carried = acc.reset()
  for flag in [1, 1]:
    carried = carried.merge(Streak.of(True))
  assert int(carried.longest) == 3 and int(carried.current) == 3


def test_best_is_one_rule_of_which_metric_and_which_way():
  """Issue 29.7: keep-best, early stopping and the population's ranking all
  score by purax.core.metrics.Best: lower is better, max negated, NaN worst."""
  import pytest
  from purax.core.errors import ConfigError
  record = {'eval/loss': 0.3, 'eval/accuracy': 0.9, 'train/loss': float('nan')}
  assert metrics.Best('eval/loss', 'min').score(record) == np.float32(0.3)
  assert metrics.Best('eval/accuracy', 'max').score(record) == np.float32(-0.9)
  assert metrics.Best('train/loss', 'min').score(record) == np.inf
  assert metrics.Best('loss').key == 'eval/loss'               # a bare name is an eval metric
  np.testing.assert_array_equal(metrics.to_minimise(np.array([1.0, np.nan, -2.0]), 'max'),
                                [-1.0, np.inf, 2.0])
  traced = jax.jit(lambda v: metrics.to_minimise(v, 'max'))(jnp.array([1.0, np.inf]))
  np.testing.assert_array_equal(traced, [-1.0, np.inf])        # jit-safe: populations use it
  with pytest.raises(ConfigError, match=r"best_metric: expected one of \['eval/accuracy', "):
    metrics.Best('eval/bleu', 'max').score(record)
  with pytest.raises(ConfigError, match=r"best_mode: expected 'min' or 'max', got 'up'"):
    metrics.Best('eval/loss', 'up')


def _window_steps(flags, members=None):
  """Step metrics like a train step's: a loss average, an example count and a
  skip streak (int32), optionally with a [members] axis."""
  shape = () if members is None else (members,)
  out = []
  for i, flag in enumerate(flags):
    out.append({'loss': metrics.Average(jnp.full(shape, 0.5 * i), jnp.ones(shape)),
                'examples': metrics.Sum(jnp.full(shape, 8.0)),
                'skip_streak': metrics.Streak(jnp.full(shape, flag, jnp.int32),
                                              jnp.full(shape, flag, jnp.int32))})
  return out


def test_a_window_merges_zeroes_and_computes_as_its_tree_does():
  """The packed window a plan carries (one float32 array) is the tree's
  arithmetic: the same numbers after merges (a streak's merge included),
  zeros_like keeps a streak's running count, the tree comes back with its
  dtypes (the checkpoint's layout), for a population's [members] leaves too."""
  for members in (None, 3):
    steps = _window_steps([0, 1, 1, 0, 1, 1, 1], members)
    tree = metrics.zeros_like(jax.tree.map(jnp.zeros_like, steps[0]))
    packed = metrics.window(tree)
    assert isinstance(packed, metrics.Window) and len(jax.tree.leaves(packed)) == 1
    merge = jax.jit(metrics.merge)
    for m in steps:
      tree, packed = merge(tree, m), merge(packed, m)
      assert isinstance(packed, metrics.Window)
    got, want = metrics.compute(packed), metrics.compute(tree)
    assert got.keys() == want.keys()
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])
    back = metrics.as_tree(packed)
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(tree)):
      assert a.dtype == b.dtype and a.shape == b.shape
      np.testing.assert_array_equal(a, b)
    zeroed = metrics.as_tree(metrics.zeros_like(packed))
    np.testing.assert_array_equal(zeroed['skip_streak'].current, tree['skip_streak'].current)
    assert float(np.sum(zeroed['examples'].value)) == 0.0


def test_a_window_holds_only_what_float32_holds_exactly():
  """A float64 or int64 leaf stays a tree: packing would round it."""
  wide = {'n': metrics.Sum(np.zeros((), np.float64))}
  assert metrics.window(wide) is wide
  abstract = metrics.window(jax.eval_shape(lambda: _window_steps([0])[0]))
  assert abstract.values.shape == (5,) and abstract.values.dtype == jnp.float32


def test_the_single_device_step_carries_its_metrics_as_one_array():
  """Issue 32: each argument of the jitted train step costs the call's
  dispatch and a kernel of its own; the running metrics are one array."""
  import purax
  from tests.helpers import tiny_batch, tiny_task
  task, batch = tiny_task('mlp'), tiny_batch()
  plan = purax.plan.SingleDevicePlan(task)
  state = task.init(jax.random.key(0), batch)
  acc = plan.zero_metrics(state, batch)
  assert len(jax.tree.leaves(acc)) == 1
  state, acc = plan.train_step(state, acc, batch)
  assert len(jax.tree.leaves(acc)) == 1 and metrics.compute(acc)['examples'] == 8.0
