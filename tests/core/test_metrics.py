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
