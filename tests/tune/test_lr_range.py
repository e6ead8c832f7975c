"""purax.tune.lr_range_test: a grid of learning rates trained at once, in one
compiled program; the curve, the plot and a suggestion by a documented rule.

The members are vmapped (``strategy='vmap'``, what a GPU runs): on the CPU
``'auto'`` runs them one by one in the same single program, which XLA:CPU
unrolls for a convolution (three times the compile time of this CNN)."""

import jax
import numpy as np
import optax
import pytest

import purax
from purax import tune
from purax.app import plot
from purax.io import datasets, pipeline
from purax.core import objectives
from purax.nn import CNN, MLP
from tests.helpers import compilations, tiny_batch, tiny_task

STEPS, GRID = 24, 6
TASK = purax.Task(model=CNN(num_classes=10, features=(4, 8), hidden=16),
                  tx=purax.adamw(learning_rate=1e-3, total_steps=STEPS, warmup_steps=0))


@pytest.fixture(scope='module')
def digits():
  ds = datasets.load('digits')
  data = pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=32, seed=0, num_steps=STEPS)
  batches = [data[s] for s in range(STEPS)]
  init = jax.jit(TASK.init)
  state = init(jax.random.key(0), batches[0])
  with compilations() as compiles:
    result = tune.lr_range_test(TASK, state, batches, lrs=tune.log_grid(1e-4, 10.0, GRID),
                                steps=STEPS, strategy='vmap')
  return result, compiles, batches, init


def test_the_grid_trains_in_one_compiled_program(digits):
  result, compiles, batches, init = digits
  assert len(compiles) == 1, compiles          # the population's step; nothing per rate
  state = init(jax.random.key(1), batches[0])
  with compilations() as again:                # other rates, the same grid size: no new one
    tune.lr_range_test(TASK, state, batches, lrs=tune.log_grid(3e-4, 3e-2, GRID), steps=STEPS,
                       rule='minimum', strategy='vmap')
  assert again == []
  assert result.losses.shape == (STEPS, GRID) and result.lrs.shape == (GRID,)


def test_the_curve_and_the_suggestion_on_digits(digits, tmp_path):
  """Every member starts at the same loss (the same state and batch: only the
  rate differs); the rates above the best blow the loss up, the largest past
  twice the first loss (diverged); the suggestion is the rate of least loss,
  and the PNG is drawn."""
  result = digits[0]
  first = result.losses[0]
  np.testing.assert_allclose(first, first[0], rtol=1e-6)
  points = result.losses[-result.window:].mean(axis=0)
  np.testing.assert_array_equal(result.diverged, points > 2 * first)
  assert result.diverged[-1] and not result.diverged[:-2].any()
  np.testing.assert_array_equal(result.smoothed[~result.diverged], points[~result.diverged])
  best = int(np.argmin(result.smoothed))
  assert 0 < best < GRID - 1 and points[-1] > 10 * result.smoothed[best]
  assert result.rule == 'lowest' and result.suggestion == result.lrs[best]
  assert result.suggestion == tune.suggest(result.lrs, result.smoothed, 'lowest')
  assert result.lrs[0] <= result.suggest('steepest') < result.lrs[best]
  assert result.suggest('minimum') == pytest.approx(result.lrs[best] / 10)
  path = plot.plot_lr_range(result, str(tmp_path / 'lr.png'))
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_a_member_that_diverges_is_left_out_of_the_curve():
  """Plain SGD (``optax.inject_hyperparams``: ``hparam='learning_rate'``) on a
  regression at rate 10 overflows within a few steps: that member is frozen,
  its losses are NaN from then on, its point is +inf, and the rule uses the others."""
  task = purax.Task(model=MLP(num_classes=1, features=(16,)),
                    tx=optax.inject_hyperparams(optax.sgd)(learning_rate=0.1),
                    loss=objectives.regression)
  rng = np.random.default_rng(0)
  batches = [{'x': rng.normal(size=(8, 6)).astype(np.float32),
              'y': rng.normal(size=(8, 1)).astype(np.float32)} for _ in range(8)]
  state = jax.jit(task.init)(jax.random.key(0), batches[0])
  result = tune.lr_range_test(task, state, batches, lrs=[1e-3, 1e-2, 1e-1, 10.0], steps=8,
                              hparam='learning_rate', strategy='vmap')
  assert result.diverged.tolist() == [False, False, False, True]
  assert np.isnan(result.losses[-1, -1]) and np.isfinite(result.losses[:, :3]).all()
  assert result.smoothed[-1] == np.inf and result.suggestion in result.lrs[:3]
  # Every rate diverging: a named error saying what to change, not a suggestion.
  with pytest.raises(tune.RangeTestError, match=r'lrs: expected at least two learning rates '
                     r'that train without diverging .*lower the grid .*, got 0 of 2'):
    tune.lr_range_test(task, state, batches, lrs=[5.0, 10.0], steps=8,
                       hparam='learning_rate', strategy='vmap')


@pytest.mark.parametrize('smoothed, rule, want', [
    ([2.3, 2.2, 1.0, 0.5, 0.4, np.inf], 'lowest', 1e-1),
    ([2.3, 2.2, 1.0, 0.5, 0.4, np.inf], 'largest_within', 1e-1),
    ([2.3, 2.2, 0.41, 0.40, 0.43, 9.0], 'largest_within', 1e-1),   # 0.43 <= 1.1 * 0.40
    ([2.3, 2.2, 0.41, 0.40, 0.45, 9.0], 'largest_within', 1e-2),   # 0.45 > 1.1 * 0.40
    ([2.3, 2.2, 0.41, 0.40, 0.43, 9.0], 'lowest', 1e-2),
    ([np.nan, 2.3, 1.0, 0.2, 0.9, np.inf], 'lowest', 1e-2),          # NaN, inf: diverged
    ([2.3, 2.2, 1.0, 0.5, 0.4, np.inf], 'steepest', 1e-3),   # from 2.2 to 0.5 around 1e-3
    ([2.3, 2.2, 1.0, 0.5, 0.4, np.inf], 'minimum', 1e-1 / 10),
    ([2.3, 2.2, 1.0, 0.5, 3.0, 9.0], 'steepest', 1e-3),      # the rise after the minimum ignored
    ([2.3, 2.25, 2.2, 0.3, 0.9, np.inf], 'steepest', 1e-3),  # the minimum ends the descent
    ([0.5, 0.9, 2.0, np.inf, np.inf, np.inf], 'steepest', 1e-5),   # the grid starts too high
    ([np.nan, 2.3, 1.0, 0.2, 0.9, np.inf], 'steepest', 1e-4),   # NaN: diverged
    ([2.3, 0.4, 1.0, 3.0, np.inf, np.inf], 'steepest', 1e-5),   # nothing below the best but one
])
def test_the_rules_on_known_curves(smoothed, rule, want):
  lrs = np.geomspace(1e-5, 1.0, 6)
  assert tune.suggest(lrs, smoothed, rule) == pytest.approx(want)


def test_a_rate_is_judged_by_the_loss_it_ended_at():
  """The point of a rate is the mean of its LAST ``window`` losses: rate 1e-1
  falls fastest but ends high, rate 1e-2 ends lowest; a mean of the first
  steps would rank them the other way."""
  steps = 8
  slow = np.linspace(2.0, 0.5, steps)                         # ends at 0.5
  fast = np.array([2.0, 0.2, 0.2, 0.3, 0.6, 0.9, 1.0, 1.1])   # low early, ends at 1.05
  flat = np.full(steps, 2.0)
  result = tune.LRRange.of([1e-3, 1e-2, 1e-1], np.stack([flat, slow, fast], axis=1),
                           np.zeros(3, bool), window=2)
  np.testing.assert_allclose(result.smoothed, [2.0, slow[-2:].mean(), 1.05])
  assert result.suggestion == pytest.approx(1e-2) and not result.diverged.any()


def test_a_rate_whose_loss_ends_above_twice_the_first_diverged():
  """Finite losses that end above 2x the first loss (the stated factor) mark
  the rate diverged: +inf, never suggested, by any rule; just below, not."""
  steps, start = 8, np.full(8, 2.0)
  ends = lambda end: np.concatenate([[2.0], np.full(steps - 1, end)])   # noqa: E731
  losses = np.stack([start, np.linspace(2.0, 1.0, steps), ends(3.9), ends(4.1)], axis=1)
  result = tune.LRRange.of([1e-3, 1e-2, 1e-1, 1.0], losses, np.zeros(4, bool), window=2)
  assert result.diverged.tolist() == [False, False, False, True]
  assert result.smoothed[-1] == np.inf and np.isfinite(result.smoothed[:3]).all()
  for rule in tune.RULES:
    assert result.suggest(rule) < 1.0


def test_a_test_that_measured_nothing_usable_is_a_named_error():
  lrs = [1e-3, 1e-2, 1e-1]
  down = np.linspace(2.0, 1.0, 8)[:, None] * np.ones(3)
  with pytest.raises(tune.RangeTestError, match=r'^steps: expected at least 8 steps for a '
                     r'range test to tell the rates apart \(raise --steps\), got 2$'):
    tune.LRRange.of(lrs, down[:2], np.zeros(3, bool), window=1)
  with pytest.raises(tune.RangeTestError, match=r'flat: the rates trained alike\); widen the '
                     r'grid \(--min-lr, --max-lr\) or train longer \(--steps\), got a span of 0'):
    tune.LRRange.of(lrs, down, np.zeros(3, bool), window=2)
  stuck = np.concatenate([down[:1], np.stack([np.full(7, v) for v in (2.0, 2.3, 3.0)], 1)])
  with pytest.raises(tune.RangeTestError, match=r'a rate whose loss ends at least 1% below the '
                     r'first loss 2 \(none trained.*got a least loss of 2$'):
    tune.LRRange.of(lrs, stuck, np.zeros(3, bool), window=2)     # e.g. every rate too high
  up = np.concatenate([down[:1], np.full((7, 3), 5.0)])
  with pytest.raises(tune.RangeTestError, match=r'got 0 of 3'):
    tune.LRRange.of(lrs, up, np.zeros(3, bool), window=2)
  assert issubclass(tune.RangeTestError, purax.ConfigError)
  batch = tiny_batch()
  task = tiny_task('mlp')
  with pytest.raises(tune.RangeTestError, match='steps: expected at least 8 steps'):
    tune.lr_range_test(task, task.abstract_state(batch), [batch] * 2, steps=2)


def test_bad_input_is_named():
  batch = tiny_batch()
  task = tiny_task('mlp')
  state = task.abstract_state(batch)    # refused before anything runs
  with pytest.raises(tune.RangeTestError, match='lrs: expected at least two learning rates '
                     'that train without diverging'):
    tune.suggest([1e-3, 1e-2], [1.0, np.inf])
  with pytest.raises(purax.ConfigError, match="rule: expected one of"):
    tune.suggest([1e-3, 1e-2], [1.0, 0.5], 'valley')
  with pytest.raises(purax.DataError, match='batches: expected at least steps=8 batches, got 2'):
    tune.lr_range_test(task, state, [batch, batch], steps=8)
  with pytest.raises(purax.ConfigError, match=r'hyperparameter learning_rate\[1\]'):
    tune.lr_range_test(task, state, [batch], steps=1, lrs=[1e-3, 20.0])
  with pytest.raises(purax.ConfigError, match="hparam: expected one of"):
    tune.lr_range_test(task, state, [batch], steps=1, hparam='lr')
  with pytest.raises(purax.ConfigError, match='min_lr, max_lr: expected 0 < min_lr < max_lr'):
    tune.log_grid(1.0, 1e-3)
