"""Donation never deletes a caller's array (issue 14, item 8).

Every public function that puts caller arrays into a state must copy them: a
jitted step donates its state, and a donated buffer shared with the caller
leaves the caller holding a deleted array ("Array has been deleted").
``consume`` stands for any donated step.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purax
from purax import parallel
from purax.core import pbt
from purax.core import population as pop_lib

TASK = purax.Task(model=purax.nn.MLP(num_classes=4, features=(8,)),
                  tx=purax.adamw(learning_rate=1e-2, total_steps=10))
BATCH = {'x': np.ones((8, 4), np.float32), 'y': np.zeros((8,), np.int32)}

consume = jax.jit(lambda tree: jax.tree.map(lambda x: x, tree), donate_argnums=0)


def _usable(tree):
  for leaf in jax.tree.leaves(tree):
    assert not leaf.is_deleted()
    np.asarray(leaf if not jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
               else jax.random.key_data(leaf))


def test_set_hyperparams_copies_the_callers_array():
  lr = jnp.asarray(3e-4, jnp.float32)
  state = TASK.init(jax.random.key(0), BATCH)
  state = purax.set_hyperparams(state, learning_rate=lr)
  jax.jit(TASK.step, donate_argnums=0)(state, BATCH)
  _usable(lr)
  assert float(lr) == pytest.approx(3e-4)


def test_shard_and_shard_state_copy_a_state_already_in_place():
  mesh = parallel.make_mesh(data=8)
  rules = parallel.data_parallel()
  plan = parallel.sharded(TASK, mesh, rules, BATCH)
  mine = plan.init(jax.random.key(0))               # already in the plan's sharding
  for placed in (plan.shard_state(mine), parallel.shard(mine, mesh, rules)):
    plan.step(placed, plan.shard_batch(BATCH))      # donates `placed`
    _usable(mine)


def test_exploit_explore_shares_no_buffer_with_its_input():
  pop = pop_lib.init(TASK, jax.vmap(jax.random.key)(jnp.arange(2)),
                     {'learning_rate': np.float32([1e-3, 1e-2])}, BATCH)
  new, _ = pbt.exploit_explore(pop, jnp.float32([0.1, 0.2]), key=jax.random.key(0),
                               fraction=0.5)
  consume(new)
  _usable(pop)


# population.py is the lead's file: the fix there is to copy, see the report.
def test_population_set_hparams_copies_the_callers_array():
  lr = jnp.asarray(3e-4, jnp.float32)
  state = purax.set_hyperparams(TASK.init(jax.random.key(0), BATCH), {'learning_rate': lr})
  consume(state)
  _usable(lr)


def test_population_init_copies_the_callers_array():
  lrs = jnp.asarray([1e-3, 1e-2], jnp.float32)
  pop = pop_lib.init(TASK, jax.vmap(jax.random.key)(jnp.arange(2)),
                     {'learning_rate': lrs}, BATCH)
  consume(pop)
  _usable(lrs)


def test_replicate_and_unreplicate_make_new_arrays():
  state = TASK.init(jax.random.key(0), BATCH)
  consume(parallel.replicate(state, 2))
  _usable(state)
  stacked = parallel.replicate(state, 2)
  consume(parallel.unreplicate(stacked))
  _usable(stacked)
