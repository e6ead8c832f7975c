"""shard(): specs per strategy, FSDP memory from addressable shards, clear errors."""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import purax
from purax import ConfigError, DataError, parallel

TASK = purax.Task(model=purax.nn.MLP(num_classes=4, features=(64, 64)),
                  tx=purax.adamw(learning_rate=1e-2, total_steps=10))
BATCH = {'x': np.zeros((16, 32), np.float32), 'y': np.zeros((16,), np.int32)}


@functools.cache
def _state():
  return jax.jit(TASK.init)(jax.random.key(0), BATCH)


def test_logical_axes_follow_annotations_into_adam_moments():
  logical = parallel.logical_axes(TASK, BATCH)
  assert logical.params['Dense_0']['kernel'] == P('embed', 'mlp')
  assert logical.params['Dense_1']['kernel'] == P('mlp', 'embed')
  assert logical.params['Dense_2']['kernel'] == P('embed', 'classes')
  adam = logical.opt_state.inner_state[1][0]
  assert adam.mu == logical.params and adam.nu == logical.params
  # Task.init unboxes: the state holds plain arrays.
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(_state().params))


def test_data_parallel_replicates_state_and_splits_batch():
  mesh = parallel.make_mesh(data=4, fsdp=2)
  state = parallel.shard(_state(), mesh, parallel.data_parallel())
  assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(state))
  batch = parallel.shard(BATCH, mesh, parallel.data_parallel())
  assert batch['x'].sharding.spec == P(('data', 'fsdp'), None)
  assert batch['x'].addressable_shards[0].data.shape == (2, 32)


def test_tensor_parallel_splits_by_table():
  mesh = parallel.make_mesh(data=4, tensor=2)
  rules = parallel.tensor_parallel()
  state = parallel.shard(_state(), mesh, rules, logical=parallel.logical_axes(TASK, BATCH))
  assert state.params['Dense_0']['kernel'].sharding.spec == P(None, 'tensor')
  assert state.params['Dense_0']['bias'].sharding.spec == P('tensor')
  assert state.params['Dense_1']['kernel'].sharding.spec == P('tensor', None)
  assert state.opt_state.inner_state[1][0].mu['Dense_0']['kernel'].sharding.spec == \
      P(None, 'tensor')


def test_fsdp_bytes_per_device_are_one_nth_up_to_small_arrays():
  """Per-device bytes of params + opt state, read from addressable shards."""
  n = 8
  mesh = parallel.make_mesh(fsdp=n)
  rules = parallel.fsdp(min_size=1024)
  state = parallel.shard(_state(), mesh, rules)
  tree = (state.params, state.opt_state)
  leaves = jax.tree.leaves(tree)
  total = sum(x.nbytes for x in leaves)
  small = sum(x.nbytes for x in leaves if x.size < rules.fsdp_min_size)
  assert all(x.sharding.is_fully_replicated for x in leaves if x.size < 1024)
  assert not any(x.sharding.is_fully_replicated for x in leaves if x.size >= 1024)
  per_device = parallel.bytes_per_device(tree)
  assert len(per_device) == n
  for nbytes in per_device.values():
    assert nbytes == (total - small) // n + small
  assert small < 0.1 * total   # the replicated remainder is small here


def test_fsdp_leaves_arrays_with_no_divisible_dim_replicated():
  mesh = parallel.make_mesh(fsdp=8)
  tree = {'odd': np.zeros((33, 35), np.float32), 'big': np.zeros((40, 64), np.float32)}
  out = parallel.shard(tree, mesh, parallel.fsdp(min_size=16))
  assert out['odd'].sharding.is_fully_replicated
  assert out['big'].sharding.spec == P(None, 'fsdp')   # the largest divisible dim


def test_global_batch_not_divisible_by_batch_axes():
  mesh = parallel.make_mesh(data=4, fsdp=2)
  bad = {'x': np.zeros((12, 32), np.float32), 'y': np.zeros((12,), np.int32)}
  with pytest.raises(DataError, match=r"batch\['x'\].shape\[0\] \(global batch size\): "
                     r"expected a multiple of 8 \(the mesh splits the batch over "
                     r"data=4 x fsdp=2\), got 12"):
    parallel.shard(bad, mesh, parallel.data_parallel())
  with pytest.raises(DataError, match='expected a multiple of 8'):
    parallel.sharded(TASK, mesh, parallel.data_parallel(), bad)


def test_rule_naming_unknown_mesh_axis():
  mesh = parallel.make_mesh(data=4, tensor=2)
  with pytest.raises(ConfigError, match=r"rules.table\['mlp'\]: expected mesh axes among "
                     r"\('data', 'fsdp', 'tensor'\) \(or None\), got 'model'"):
    parallel.sharded(TASK, mesh, parallel.tensor_parallel({'mlp': 'model'}), BATCH)
  with pytest.raises(ConfigError, match=r"rules.batch_axes: .*got 'dp'"):
    parallel.shard(BATCH, mesh, parallel.Rules(batch_axes=('dp',)))
  with pytest.raises(ConfigError, match=r"rules.fsdp_axis: .*got 'zero'"):
    parallel.shard(_state(), mesh, parallel.Rules(fsdp_axis='zero'))


def test_tensor_parallel_errors():
  mesh = parallel.make_mesh(data=1, tensor=8)
  with pytest.raises(ConfigError, match=r'logical: expected the logical axes'):
    parallel.shard(_state(), mesh, parallel.tensor_parallel())
  # 'classes' (4) cannot be split 8 ways.
  with pytest.raises(ConfigError, match=r"state.params\['Dense_2'\]\['bias'\].shape\[0\] \('classes'\): expected a "
                     r"multiple of 8 .*got 4"):
    parallel.sharded(TASK, mesh, parallel.tensor_parallel({'classes': 'tensor'}), BATCH)
  with pytest.raises(ConfigError, match='each mesh axis used by at most one dimension'):
    parallel.sharded(TASK, mesh, parallel.tensor_parallel(
        {'embed': 'tensor', 'mlp': 'tensor'}), BATCH)
