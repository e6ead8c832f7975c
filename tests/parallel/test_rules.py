"""Sharding rules (purax.parallel.rules): FSDP splits an array along its
largest divisible dimension or leaves it replicated; the batch must divide
over the batch axes; a rule naming a mesh axis that is not there, a tensor
parallel table that cannot split a dimension or uses a mesh axis twice, and
tensor parallelism without logical axes are named errors."""

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from purax import ConfigError, DataError, parallel
from tests.helpers_shard import BATCH, TASK, state as _state


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
