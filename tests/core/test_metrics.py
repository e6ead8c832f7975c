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
