"""PBT (Jaderberg et al. 2017): exploit copies exactly, explore keeps float32,
and with PBT off a population is just independent runs."""

import chex
import jax
import purax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from purax.core import pbt
from purax.core import population as P
from purax.core.errors import ConfigError

from tests import helpers_population as tp

FACTORS = (0.8, 1.25)


def trained(lrs, steps=2):
  pop = tp.pinit(tp.TASK, tp.keys(list(range(len(lrs)))),
                 {'learning_rate': np.float32(lrs)}, tp.batch())
  for s in range(steps):
    pop, _ = tp.pstep(tp.TASK, pop, tp.batch(s))
  return pop


POP = None


def population():
  global POP   # trained once, reused: the tests only read it
  if POP is None:
    POP = trained([1e-3, 3e-3, 1e-2])
  return POP


@settings(max_examples=8)
@given(scores=st.permutations([0.1, 0.5, 0.9]), seed=st.integers(0, 2**16),
       nan=st.booleans())
def test_exploit_copies_source_state_exactly_and_explore_perturbs(scores, seed, nan):
  pop = population()
  scores = np.float32(scores)
  if nan:
    scores[int(np.argmax(scores))] = np.nan   # NaN ranks worst, like the max
  new, info = pbt.exploit_explore(pop, jnp.asarray(scores), key=jax.random.key(seed),
                                  fraction=0.34, factors=FACTORS)
  source, copied = np.asarray(info['source']), np.asarray(info['copied'])
  worst, best = int(np.nanargmax(np.where(np.isnan(scores), np.inf, scores))), \
      int(np.argmin(np.where(np.isnan(scores), np.inf, scores)))
  assert copied.tolist() == [i == worst for i in range(3)] and source[worst] == best
  old_hp, new_hp = jax.device_get((purax.hyperparams(pop.state), purax.hyperparams(new.state)))
  for i in range(3):
    src = P.member(pop, int(source[i]))
    got = P.member(new, i)
    chex.assert_trees_all_equal(got.params, src.params)
    chex.assert_trees_all_equal(got.model_state, src.model_state)
    chex.assert_trees_all_equal(got.step, src.step)
    # The optimizer state (moments, counts) is the source's, bit for bit ...
    chex.assert_trees_all_equal(got.opt_state._replace(hyperparams={}),
                                src.opt_state._replace(hyperparams={}))
    # ... and so are its hyperparameters, but for the explored learning rate.
    assert jax.random.key_data(got.rng).tolist() == \
        jax.random.key_data(P.member(pop, i).rng).tolist()   # own key kept
    for name, value in new_hp.items():
      assert value.dtype == jnp.float32, name
      want = old_hp[name][source[i]]
      if name == 'learning_rate' and copied[i]:
        assert value[i] in [np.float32(want * np.float32(f)) for f in FACTORS]
      else:
        assert value[i] == want, name
  again, _ = pbt.exploit_explore(pop, jnp.asarray(scores), key=jax.random.key(seed),
                                 fraction=0.34, factors=FACTORS)
  chex.assert_trees_all_equal(again, new)   # seeded: reruns identically


def test_exploit_revives_a_diverged_member_from_a_healthy_one():
  pop = population().replace(diverged=jnp.array([False, True, False]))
  new, info = pbt.exploit_explore(pop, jnp.float32([0.2, jnp.nan, 0.1]),
                                  key=jax.random.key(0), fraction=0.34)
  assert np.asarray(info['source']).tolist() == [0, 2, 2]
  assert np.asarray(new.diverged).tolist() == [False, False, False]


def test_pbt_off_population_equals_independent_runs():
  # run_population with pbt_every=0 and early stopping off: member i is the
  # standalone run i (tolerance as in test_population).
  from purax import loop as sweep
  from purax.plan import PopulationPlan
  HOOKS = lambda: purax.hooks.standard(  # noqa: E731
      eval_data=[tp.batch(9)], eval_every=2, log_every=2, progress=False,
      max_consecutive_skips=None)
  lrs, k = np.float32([1e-3, 3e-3, 1e-2]), 4
  pop = tp.pinit(tp.TASK, tp.keys([0, 1, 2]), {'learning_rate': lrs}, tp.batch())
  data = [tp.batch(s) for s in range(k)]
  with jax.default_matmul_precision('highest'):
    pop, history = sweep.fit(tp.TASK, pop, data, plan=PopulationPlan(tp.TASK), hooks=HOOKS())
    assert not any('pbt/source' in r for r in history)
    for i in range(3):
      state, _ = tp.standalone(i, {'learning_rate': lrs[i]}, data, k)
      chex.assert_trees_all_close(P.member(pop, i).params, state.params,
                                  rtol=tp.RTOL, atol=tp.ATOL)
  # With PBT on, the same loop records who copied whom at the evaluation.
  pop = tp.pinit(tp.TASK, tp.keys([0, 1, 2]), {'learning_rate': lrs}, tp.batch())
  _, history = sweep.fit(tp.TASK, pop, data, plan=PopulationPlan(tp.TASK), hooks=HOOKS() + [
      purax.hooks.PBT(every=2, fraction=0.34)])
  sources = [r['pbt/source'] for r in history if 'pbt/source' in r]
  assert len(sources) == 1 and sorted(set(sources[0].tolist())) != [0, 1, 2]


def test_bfloat16_population_hyperparameters_stay_float32_through_pbt():
  task = tp.make_task(jnp.bfloat16)
  pop = jax.jit(P.init, static_argnums=0)(
      task, tp.keys([0, 1]), {'learning_rate': np.float32([1e-3, 2e-3])}, tp.batch())
  new, _ = pbt.exploit_explore(pop, jnp.float32([0.0, 1.0]), key=jax.random.key(1),
                               fraction=0.5, names=('learning_rate', 'b2'))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(new.state.params))
  for name, value in purax.hyperparams(new.state).items():
    assert value.dtype == jnp.float32, name
  assert float(purax.hyperparams(new.state)['b2'][1]) < 1.0   # clipped to its bound


def test_bad_arguments_are_named():
  pop = population()
  with pytest.raises(ConfigError, match=r'fraction: expected in \(0, 0.5\], got 0.9'):
    pbt.exploit_explore(pop, jnp.zeros(3), key=jax.random.key(0), fraction=0.9)
  with pytest.raises(ConfigError, match=r"names: expected hyperparameters among .*'lr'"):
    pbt.exploit_explore(pop, jnp.zeros(3), key=jax.random.key(0), names=('lr',))
  with pytest.raises(ConfigError, match=r'scores.shape: expected \[3\]'):
    pbt.exploit_explore(pop, jnp.zeros(2), key=jax.random.key(0))


def test_explore_cannot_make_a_hyperparameter_non_finite():
  """Issue 28.5: PBT writes its perturbed values traced (unchecked by the
  setter), so they are finite by construction: finite factors (an infinite
  one refused by name) and finite clip ends (an infinite bound, or the
  default one of a name without a row, clips at float32's largest value)."""
  pop = population()
  with pytest.raises(ConfigError, match=r'^factors: expected one or more finite positive '
                                        r'numbers, got \(1.25, inf\)'):
    pbt.exploit_explore(pop, jnp.zeros(3), key=jax.random.key(0), factors=(1.25, np.inf))
  huge = pop.replace(state=purax.set_hyperparams(pop.state, eps=np.float32([3e38] * 3)))
  for bounds in (None, {'eps': (0.0, np.inf)}):
    new, info = pbt.exploit_explore(huge, jnp.float32([0.0, 1.0, 2.0]), key=jax.random.key(0),
                                    factors=(1.25,), names=('eps',), bounds=bounds)
    assert np.asarray(info['copied']).tolist() == [False, False, True]
    eps = np.asarray(purax.hyperparams(new.state)['eps'])
    assert np.isfinite(eps).all() and eps[2] > np.float32(3e38), (bounds, eps)
