"""Populations: member i of a vmapped run equals a standalone run with hparams i.

Tolerance. Everything runs at ``jax.default_matmul_precision('highest')`` in
float32. The vmapped step batches each matmul over members
(``dot_general`` with a batch dimension) while the standalone step does not,
so XLA may pick another summation order: one rounding difference per
accumulation, ~1e-7 relative. Adam divides by sqrt(v) and so keeps such
differences at their relative size rather than amplifying them, and clipping
and the cosine schedule are smooth; after k <= 3 steps of lr <= 1e-2 that is
well inside ``rtol=1e-5, atol=1e-6`` (atol for parameters that start at zero,
the biases). On CPU the results are in fact bitwise equal in our runs, but we
do not promise that.
"""

import dataclasses
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import purax
from purax.core import metrics as metrics_lib
from purax.core import population as P
from purax.core.errors import ConfigError
from purax.core.metrics import zeros_of as zero_metrics
from purax.plan import train_step
from tests.helpers import assert_bitwise, params_differ, with_hyperparam

from tests.helpers_population import (ATOL, FEATURES, RTOL, TASK, batch,
                                     keys, make_task, pinit, pstep, sinit,
                                     stacked_batches, standalone)


member_hparams = st.fixed_dictionaries({
    'learning_rate': st.sampled_from([1e-4, 3e-4, 1e-3, 3e-3, 1e-2]),
    'weight_decay': st.sampled_from([0.0, 1e-4, 1e-2]),
    'b2': st.sampled_from([0.99, 0.999]),
    'clip_norm': st.sampled_from([0.5, 1.0]),
    'label_smoothing': st.sampled_from([0.0, 0.1]),
})


@st.composite
def populations(draw):
  # Member counts from a small set, so the compiled programs are shared.
  n = draw(st.sampled_from([1, 3]))
  return draw(st.lists(st.tuples(st.integers(0, 2**16), member_hparams), min_size=n,
                       max_size=n))


@settings(max_examples=4)
@given(members=populations(), k=st.sampled_from([1, 3]), per_member=st.booleans())
def test_member_i_equals_standalone_run_with_hparams_i(members, k, per_member):
  seeds = [s for s, _ in members]
  hparams = {n: np.asarray([hp[n] for _, hp in members], np.float32) for n in members[0][1]}
  # Per-member data: member i reads batch stack[i] at every step; shared: one batch.
  data = [stacked_batches([i + 10 * s for i in range(len(seeds))]) for s in range(k)] \
      if per_member else [batch(s) for s in range(k)]
  index = jnp.arange(len(seeds)) if per_member else None
  with jax.default_matmul_precision('highest'):
    pop = pinit(TASK, keys(seeds), hparams, batch())
    history = []
    for s in range(k):
      pop, m = pstep(TASK, pop, data[s], index)
      history.append(metrics_lib.compute(m))
    for i, seed in enumerate(seeds):
      own = [jax.tree.map(lambda x: x[i], d) for d in data] if per_member else data
      state, single = standalone(seed, {n: v[i] for n, v in hparams.items()}, own, k)
      chex.assert_trees_all_close(P.member(pop, i).params, state.params, rtol=RTOL, atol=ATOL)
      chex.assert_trees_all_close(P.member(pop, i).opt_state, state.opt_state,
                                  rtol=RTOL, atol=ATOL)
      assert int(pop.state.step[i]) == int(state.step) == k
      for got, want in zip(history, single):
        for name in ('loss', 'accuracy', 'grad_norm', 'examples'):
          np.testing.assert_allclose(got[name][i], want[name], rtol=RTOL, atol=ATOL)
  assert not np.any(np.asarray(pop.diverged))


def test_hparams_are_float32_leaves_and_one_trace_serves_any_values():
  traces = []

  def counted(pop, b):
    traces.append(1)   # runs at trace time only
    return P.step(TASK, pop, b)

  step = jax.jit(counted)
  for seeds, lrs, smoothing in (([0, 1, 2], [1e-3, 3e-3, 1e-2], [0.0, 0.1, 0.2]),
                                ([7, 8, 9], [5e-4, 2e-2, 1e-4], [0.3, 0.0, 0.05])):
    pop = pinit(TASK, keys(seeds), {'learning_rate': np.asarray(lrs),
                                    'label_smoothing': np.asarray(smoothing)}, batch())
    for name, value in purax.hyperparams(pop.state).items():
      assert value.dtype == jnp.float32 and value.shape == (3,), name
    np.testing.assert_array_equal(purax.hyperparams(pop.state)['learning_rate'],
                                  np.float32(lrs))
    for _ in range(2):
      pop, _ = step(pop, batch())
  assert len(traces) == 1


def test_diverged_member_is_frozen_flagged_and_others_unaffected():
  seeds, lrs = [0, 1, 2], np.float32([1e-2, 1e30, 3e-3])   # member 1: absurd lr
  sane = lrs.copy()
  sane[1] = 1e-3
  pops, flagged_at = {}, None
  for name, values in (('bad', lrs), ('sane', sane)):
    pop = pinit(TASK, keys(seeds), {'learning_rate': values}, batch())
    for s in range(4):
      pop, m = pstep(TASK, pop, batch(s))
      m = metrics_lib.compute(m)
      if name == 'bad' and flagged_at is None and bool(pop.diverged[1]):
        flagged_at, frozen_state = s, P.member(pop, 1)
        assert m['diverged'][1] == 1.0 and m['examples'][1] == 0.0   # flagged, not counted
    pops[name] = pop
  bad, ok = pops['bad'], pops['sane']
  assert flagged_at is not None and np.asarray(bad.diverged).tolist() == [False, True, False]
  assert int(bad.state.step[1]) == flagged_at            # no update after the bad one
  chex.assert_trees_all_equal(P.member(bad, 1), frozen_state)   # and it never changes
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(P.member(bad, 1).params))
  for i in (0, 2):   # the healthy members are bitwise those of a run without the NaN
    chex.assert_trees_all_equal(P.member(bad, i), P.member(ok, i))
  # ... and, to float32 tolerance, those of a population that lacks member 1.
  two = pinit(TASK, keys([0, 2]), {'learning_rate': lrs[[0, 2]]}, batch())
  for s in range(4):
    two, _ = pstep(TASK, two, batch(s))
  for j, i in enumerate((0, 2)):
    chex.assert_trees_all_close(P.member(two, j).params, P.member(bad, i).params,
                                rtol=RTOL, atol=ATOL)


def test_non_finite_batch_freezes_member_at_its_previous_state():
  data = stacked_batches([0, 1, 2])
  data['x'][1, 0, 0] = np.inf    # member 1's batch makes its loss non-finite
  pop0 = pinit(TASK, keys([0, 1, 2]), {}, batch())
  pop, m = pstep(TASK, pop0, data, jnp.arange(3))
  chex.assert_trees_all_equal(P.member(pop, 1), P.member(pop0, 1))
  assert np.asarray(pop.diverged).tolist() == [False, True, False]
  assert np.asarray(P.status(pop)).tolist() == ['ok', 'diverged', 'ok']
  assert int(pop.state.step[0]) == 1


def test_a_loss_scale_overflow_is_skipped_not_divergence():
  # Dynamic loss scaling starting absurdly high: the first steps overflow, the
  # task's guard skips them and halves the scale; no member is frozen, and
  # training goes on once the scale fits.
  task = dataclasses.replace(TASK, loss_scale=2.0 ** 126)
  pop0 = pinit(task, keys([0, 1]), {}, batch())
  pop, skipped = pop0, 0.0
  for s in range(12):
    large = dict(batch(s), x=batch(s)['x'] * 1e4)   # the scaled gradients overflow
    pop, m = pstep(task, pop, large)
    skipped += metrics_lib.compute(m)['skipped'].sum()
  assert skipped >= 1 and not np.asarray(pop.diverged).any()
  assert np.asarray(pop.state.step).tolist() == [12, 12]
  assert (np.asarray(pop.state.loss_scale.scale) < 2.0 ** 126).all()
  for i in range(2):
    assert params_differ(P.member(pop, i).params, P.member(pop0, i).params)


def test_early_stopping_freezes_members_that_stop_improving():
  pop = pinit(TASK, keys([0, 1, 2]), {}, batch())
  scores = [[1.0, 1.0, np.nan], [0.5, 1.0, np.nan], [0.4, 1.0, np.nan]]
  for s in scores:
    pop = P.early_stopping(pop, jnp.float32(s), patience=2)
  assert np.asarray(pop.stopped).tolist() == [False, True, True]
  np.testing.assert_array_equal(pop.best, np.float32([0.4, 1.0, np.inf]))
  before = P.member(pop, 1)
  pop, m = pstep(TASK, pop, batch())
  chex.assert_trees_all_equal(P.member(pop, 1), before)
  assert int(pop.state.step[0]) == 1 and metrics_lib.compute(m)['diverged'][1] == 0.0


def test_score_ranks_and_treats_missing_as_worst():
  m = {'accuracy': metrics_lib.Average(jnp.float32([1.0, 3.0, 0.0]), jnp.float32([2, 4, 0])),
       'loss': metrics_lib.Average(jnp.float32([1.0, jnp.nan, 2.0]), jnp.float32([1, 1, 1]))}
  np.testing.assert_array_equal(P.score(m, 'accuracy', 'max'), np.float32([-0.5, -0.75, np.inf]))
  np.testing.assert_array_equal(P.score(m, 'loss'), np.float32([1.0, np.inf, 2.0]))
  with pytest.raises(ConfigError, match="metric: expected one of"):
    P.score(m, 'acc')


def test_bfloat16_params_keep_float32_hyperparameters():
  task = make_task(jnp.bfloat16)
  pop = jax.jit(P.init, static_argnums=0)(task, keys([0, 1]), {'learning_rate': np.float32([1e-3, 2e-3]),
                                    'b2': np.float32([0.999, 0.99])}, batch())
  pop, _ = jax.jit(P.step, static_argnums=0)(task, pop, batch())
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(pop.state.params))
  for name, value in purax.hyperparams(pop.state).items():
    assert value.dtype == jnp.float32, name
  assert purax.hyperparams(pop.state)['b2'][0] == np.float32(0.999)   # not rounded to 1.0


def test_bad_input_is_named():
  with pytest.raises(ConfigError, match=r'members: expected >= 1, got 0'):
    P.init(TASK, jnp.zeros((0, 2), jnp.uint32), {}, batch())
  with pytest.raises(ConfigError, match=r"hyperparameter name: expected one of .*'lr'"):
    P.init(TASK, keys([0]), {'lr': np.float32([1e-3])}, batch())
  with pytest.raises(ConfigError, match=r"hparams\['b1'\].shape: expected \[2\]"):
    P.init(TASK, keys([0, 1]), {'b1': np.float32([0.9])}, batch())
  with pytest.raises(ConfigError, match='patience: expected >= 1'):
    P.early_stopping(pinit(TASK, keys([0, 1, 2]), {}, batch()), jnp.zeros(3), patience=0)


def test_a_non_finite_member_value_is_refused_by_init_and_the_setter_naming_the_member():
  """Issue 28.5: init checks concrete values per member (under jit they are
  traced: the step's guard covers them, next test), as the setter does on a
  stacked state."""
  with pytest.raises(ConfigError, match=r'^hyperparameter learning_rate\[1\]: expected a '
                                        r'finite value in \(0, 10\], got nan$'):
    P.init(TASK, keys([0, 1, 2]), {'learning_rate': np.float32([1e-3, np.nan, 1e-3])},
           batch())
  pop = pinit(TASK, keys([0, 1, 2]), {}, batch())
  with pytest.raises(ConfigError, match=r'^hyperparameter eps\[2\]: expected a finite value '
                                        r'in .*, got inf$'):
    purax.set_hyperparams(pop.state, eps=np.float32([1e-8, 1e-8, np.inf]))


_STRATEGY_STEP = jax.jit(P.step, static_argnums=0, static_argnames='strategy')


@pytest.mark.parametrize('strategy', ['sequential', 'vmap'])
def test_a_member_with_a_non_finite_hyperparameter_in_its_state_is_skipped_the_others_not(
    strategy):
  """Issue 28.5: a NaN learning rate written into member 1's ``opt_state`` (past
  the setters, or traced through them): member 1's update is skipped and it
  is frozen as diverged, its state bitwise as it was; the others are
  updated exactly as without it. One member at a time (the guard's cond) and
  vmapped (the cond becomes a select)."""
  pop0 = pinit(TASK, keys([0, 1, 2]), {}, batch())
  bad = pop0.replace(state=with_hyperparam(pop0.state, 'learning_rate', np.nan, member=1))
  pop, m = _STRATEGY_STEP(TASK, bad, batch(), strategy=strategy)
  clean, _ = _STRATEGY_STEP(TASK, pop0, batch(), strategy=strategy)
  assert metrics_lib.compute(m)['skipped'].tolist() == [0, 1, 0]
  assert np.asarray(pop.diverged).tolist() == [False, True, False]
  assert_bitwise(P.member(pop, 1), P.member(bad, 1), 'member 1')
  for i in (0, 2):
    assert params_differ(P.member(pop, i).params, P.member(pop0, i).params)
    assert_bitwise(P.member(pop, i), P.member(clean, i), f'member {i}')


def test_init_traces_abstractly_and_member_stack_round_trip():
  shapes = jax.eval_shape(lambda k: P.init(TASK, k, {}, batch()), keys([0, 1, 2, 3]))
  assert shapes.state.params['Dense_0']['kernel'].shape == (4, FEATURES, 16)
  pop = pinit(TASK, keys([3, 4, 5]), {}, batch())
  chex.assert_trees_all_equal(P.stack([P.member(pop, i) for i in range(3)]), pop.state)
  chex.assert_trees_all_equal(P.member(pop, 1), sinit(jax.random.key(4), {}, batch()))


def _copies(compiled_text: str) -> int:
  """XLA ``copy`` instructions of arrays with at least 16 elements (the params'
  and optimizer moments' sizes here; scalars are copied freely)."""
  shapes = re.findall(r'= \w+\[([\d,]*)\]\S* copy\(', compiled_text)
  return sum(1 for s in shapes if s and np.prod([int(d) for d in s.split(',')]) >= 16)


def test_a_one_member_population_step_copies_no_more_of_the_state_than_the_plain_step():
  # A select over the state (or a cond around the whole step) to keep frozen
  # or diverged members made XLA copy params and optimizer moments every step
  # (a tenth of a small model's step); the guard's cond does not.
  b = batch()
  pop = pinit(TASK, keys([0]), {}, b)
  state = P.member(pop, 0)
  plain = train_step.lower(TASK, state, zero_metrics(lambda s, x: TASK.step(s, x)[1], state, b),
                           b).compile().as_text()
  member = P.train_step.lower(TASK, pop, P.zero_train_metrics(TASK, pop, b), b, None,
                              strategy='auto').compile().as_text()
  assert _copies(member) <= _copies(plain), (_copies(member), _copies(plain))


def test_a_frozen_member_counts_nowhere_and_keeps_its_loss_scale():
  # The task's guard skips a frozen member's update: no metric of it counts
  # (not even as a skip), its loss scale and step stay; the others go on.
  task = dataclasses.replace(TASK, loss_scale=2.0 ** 126)     # every step overflows at first
  pop = pinit(task, keys([0, 1]), {}, batch())
  pop = pop.replace(stopped=jnp.array([False, True]))
  before = P.member(pop, 1)
  pop, m = pstep(task, pop, dict(batch(), x=batch()['x'] * 1e4))
  m = metrics_lib.compute(m)
  chex.assert_trees_all_equal(P.member(pop, 1), before)
  assert m['skipped'].tolist() == [1.0, 0.0] and m['examples'].tolist() == [0.0, 0.0]
  assert np.isnan(m['loss_scale'][1]) and m['loss_scale'][0] == 2.0 ** 126
  assert float(pop.state.loss_scale.scale[0]) < 2.0 ** 126 and int(pop.state.step[0]) == 1


def test_is_population_is_the_one_test_of_a_population():
  """``is_population`` tells a Population from a TrainState (stacked or not),
  and no module of purax asks it another way (isinstance of Population)."""
  import pathlib
  task = purax.Task(model=purax.nn.MLP(features=(4,), num_classes=3),
                    tx=purax.adamw(learning_rate=1e-3, total_steps=2))
  batch = {'x': np.zeros((2, 3), np.float32), 'y': np.zeros((2,), np.int32)}
  keys = jax.vmap(jax.random.key)(jnp.arange(2))
  pop = P.init(task, keys, {}, batch)
  assert P.is_population(pop)
  assert not P.is_population(pop.state) and not P.is_population(P.member(pop, 0))
  root = pathlib.Path(purax.__file__).parent
  asks = [f'{path.relative_to(root)}:{i}' for path in sorted(root.rglob('*.py'))
          for i, line in enumerate(path.read_text().splitlines(), 1)
          if re.search(r'isinstance\([^)]*Population\b', line)]
  assert len(asks) == 1 and asks[0].startswith('core/population.py:'), asks
