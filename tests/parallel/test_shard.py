"""shard(): specs per strategy, FSDP memory from addressable shards (the rules'
own choices and errors: tests/parallel/test_rules.py)."""

import jax
from jax.sharding import PartitionSpec as P

from purax import parallel
from tests.helpers_shard import BATCH, TASK, state as _state


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
