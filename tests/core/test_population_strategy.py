"""Population strategies: vmapping all members, vmapped chunks, or one at a time
compute the same thing; only speed and memory differ.

Tolerance. Each strategy runs every member's step as its own program shape:
``[members, ...]`` arrays under vmap, ``[chunk, ...]`` per chunk, unbatched
one at a time. XLA on CPU reduces the global gradient norm (clipping) and fuses
the AdamW update differently for different shapes, so values can differ by a
rounding per reduction (~1e-7 relative; measured: ``grad_norm`` and then the
clipped update in the last bit). We therefore hold: (1) every decision is
exactly equal — which members diverge or stop, step counts, example counts;
(2) values agree within the tolerance of ``test_population.py`` (rtol 1e-5,
atol 1e-6); (3) bitwise, where the program shape is the same: a one-member
population is the standalone run, and ``'sequential'`` member ``i`` is the
standalone run of member ``i``.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purax
from purax import plan as plan_lib
from purax.core import metrics as metrics_lib
from purax.core import population as P
from purax.core.errors import ConfigError
from tests.helpers_population import ATOL, RTOL, TASK, batch, keys, stacked_batches

MEMBERS = 5                                            # chunks of 2 leave a remainder
LRS = np.float32([1e-3, 3e-3, np.inf, 1e-2, 3e-4])     # member 2 diverges at once
STRATEGIES = ['vmap', 'sequential', 2]
pinit = jax.jit(P.init, static_argnums=0)


def run(strategy, per_member, steps=3):
  """Steps and an evaluation of a population with a diverged and a stopped member."""
  pop = pinit(TASK, keys(range(MEMBERS)), {'learning_rate': LRS}, batch())
  pop = P.early_stopping(pop, jnp.float32([1, 1, 1, 1, 1]), patience=1)
  pop = P.early_stopping(pop, jnp.float32([0, 2, 0, 0, 0]), patience=1)   # member 1 stops
  index = jnp.arange(MEMBERS) if per_member else None
  data = [stacked_batches([s * 10 + i for i in range(MEMBERS)]) if per_member else batch(s)
          for s in range(steps)]
  acc = P.zero_train_metrics(TASK, pop, data[0], index)
  for b in data:
    pop, acc = P.train_step(TASK, pop, acc, b, index, strategy=strategy)
  ev = P.eval_step(TASK, pop, P.zero_eval_metrics(TASK, pop, data[0], index), data[0], index,
                   strategy=strategy)
  return pop, acc, ev


def decisions(pop, acc, ev):
  return (np.asarray(pop.diverged), np.asarray(pop.stopped), np.asarray(pop.state.step),
          metrics_lib.compute(acc)['examples'], metrics_lib.compute(ev)['examples'])


def values(tree):
  """The float leaves (keys as their data), for comparison."""
  return jax.tree.map(lambda x: jax.random.key_data(x)
                      if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x, tree)


@pytest.mark.parametrize('per_member', [False, True])
def test_every_strategy_makes_the_same_decisions_and_values(per_member):
  reference = run('vmap', per_member)
  assert decisions(*reference)[0].tolist() == [False, False, True, False, False]
  assert decisions(*reference)[1].tolist() == [False, True, False, False, False]
  for strategy in STRATEGIES[1:]:
    got = run(strategy, per_member)
    for want_d, got_d in zip(decisions(*reference), decisions(*got)):
      np.testing.assert_array_equal(got_d, want_d, err_msg=str(strategy))
    chex.assert_trees_all_close(values(got), values(reference), rtol=RTOL, atol=ATOL)
    # A member frozen before any step is untouched whatever the strategy: bitwise.
    chex.assert_trees_all_equal(values(P.member(got[0], 1)), values(P.member(reference[0], 1)))
    # Member 2's lr = inf (traced through init's setter, unchecked): the guard
    # skipped its first update (issue 28.5; it used to make its params
    # non-finite), so it was frozen at step 0 with its initial params.
    for pop in (got[0], reference[0]):
      assert all(np.isfinite(x).all() for x in jax.tree.leaves(P.member(pop, 2).params))
      assert int(pop.state.step[2]) == 0


def test_sequential_members_and_a_one_member_population_are_the_standalone_run_bitwise():
  step = jax.jit(TASK.step)
  init = jax.jit(lambda k, lr, b: purax.set_hyperparams(TASK.init(k, b), {'learning_rate': lr}))
  lrs = LRS[[0, 1, 3]]
  seq = pinit(TASK, keys([0, 1, 2]), {'learning_rate': lrs}, batch())
  one = pinit(TASK, keys([1]), {'learning_rate': lrs[1:2]}, batch())
  for s in range(3):
    seq, _ = jax.jit(P.step, static_argnums=0, static_argnames='strategy')(
        TASK, seq, batch(s), strategy='sequential')
    one, _ = jax.jit(P.step, static_argnums=0, static_argnames='strategy')(
        TASK, one, batch(s), strategy='vmap')
  for i in range(3):
    state = init(jax.random.key(i), lrs[i], batch())
    for s in range(3):
      state, _ = step(state, batch(s))
    chex.assert_trees_all_equal(values(P.member(seq, i)), values(state))
    if i == 1:
      chex.assert_trees_all_equal(values(P.member(one, 0)), values(state))


def test_chunk_size_rule_and_bad_strategies_are_named():
  assert P.chunk_size('vmap', 64, 'cpu') == 64
  assert P.chunk_size('sequential', 64, 'gpu') == 1
  assert P.chunk_size(16, 64, 'cpu') == 16 and P.chunk_size(16, 8, 'cpu') == 8
  assert P.chunk_size('auto', 64, 'gpu') == 64 and P.chunk_size('auto', 64, 'tpu') == 64
  assert P.chunk_size('auto', 64, 'cpu') == P.AUTO_CPU_CHUNK == 1   # the measured rule
  assert P.chunk_size('chunked', 64, 'gpu') == P.CHUNK and P.chunk_size('chunked', 3) == 3
  with pytest.raises(ConfigError, match=r"strategy: expected one of \['auto', 'vmap', "
                     r"'chunked', 'sequential'\] or a chunk size >= 1, got 'map'"):
    P.chunk_size('map', 4)
  with pytest.raises(ConfigError, match='strategy: expected a chunk size >= 1, got 0'):
    P.chunk_size(0, 4)


def test_fit_takes_the_strategy_through_the_population_plan():
  data = [batch(s) for s in range(4)]
  finals = {}
  for strategy in ('vmap', 'sequential'):
    pop = pinit(TASK, keys([0, 1, 2]), {'learning_rate': LRS[[0, 1, 3]]}, batch())
    finals[strategy], _ = purax.fit(TASK, pop, data, plan=plan_lib.PopulationPlan(TASK, strategy=strategy), hooks=purax.hooks.standard(log_every=2, progress=False))
  chex.assert_trees_all_close(values(finals['sequential']), values(finals['vmap']),
                              rtol=RTOL, atol=ATOL)
  pop = pinit(TASK, keys([0, 1]), {}, batch())
  with pytest.raises(ConfigError, match="strategy: expected one of"):
    purax.fit(TASK, pop, data, plan=plan_lib.PopulationPlan(TASK, strategy='all'), hooks=purax.hooks.standard(progress=False))


def test_a_population_evaluates_the_batches_a_refilling_loader_yielded():
  """Population.evaluate copies each numpy batch on the CPU (pipeline.owned):
  the eval step may read an aligned array's memory after the call returns."""
  from tests.helpers import refilling, tiny_batch, tiny_task

  class Refilling:                       # iterated afresh at every evaluation
    def __init__(self, batches):
      self.batches = batches

    def __iter__(self):
      return refilling(self.batches)

  task = tiny_task('mlp')
  evals = [tiny_batch(n=8, seed=100 + i, weight=True) for i in range(4)]
  pop = pinit(task, keys(range(2)), {'learning_rate': np.float32([1e-3, 1e-2])}, evals[0])
  plan = plan_lib.PopulationPlan(task)
  fresh = purax.evaluate(task, pop, evals, plan=plan)
  got = purax.evaluate(task, pop, Refilling(evals), plan=plan)
  assert fresh.keys() == got.keys()
  for name in fresh:
    np.testing.assert_array_equal(fresh[name], got[name], err_msg=name)
