"""purax.parallel: one step on any mesh, on one host or many.

- :func:`make_mesh` lays out every device of every process on the axes
  ``('data', 'fsdp', 'tensor')``;
- :class:`Rules` (:func:`data_parallel`, :func:`fsdp`, :func:`tensor_parallel`)
  say how each array is split; :func:`shard` places a state or a batch;
- :func:`sharded` jits ``init`` / ``step`` / ``evaluate`` with those shardings
  and the state donated: the step is :meth:`purax.Task.step`, unchanged;
- :func:`shard_map_step` and :func:`pmap_step` are the per-device variants
  (explicit gradient ``psum``, BatchNorm ``axis_name``, a dropout key per device);
- :mod:`purax.parallel.distributed` starts multi-host runs on
  ``jax.distributed`` and builds global batches from per-process data.

Nothing here touches a device at import.
"""

from purax.parallel import distributed as distributed
from purax.parallel.mesh import AXES as AXES
from purax.parallel.mesh import make_mesh as make_mesh
from purax.parallel.mesh import parse_mesh as parse_mesh
from purax.parallel.rules import DEFAULT_TABLE as DEFAULT_TABLE
from purax.parallel.rules import Rules as Rules
from purax.parallel.rules import data_parallel as data_parallel
from purax.parallel.rules import for_mesh as for_mesh
from purax.parallel.rules import fsdp as fsdp
from purax.parallel.rules import tensor_parallel as tensor_parallel
from purax.parallel.shard import batch_sharding as batch_sharding
from purax.parallel.shard import batch_shardings as batch_shardings
from purax.parallel.shard import bytes_per_device as bytes_per_device
from purax.parallel.shard import logical_axes as logical_axes
from purax.parallel.shard import replicated as replicated
from purax.parallel.shard import shard as shard
from purax.parallel.shard import shardings as shardings
from purax.parallel.shard import state_shardings as state_shardings
from purax.parallel.spmd import pmap_step as pmap_step
from purax.parallel.spmd import replicate as replicate
from purax.parallel.spmd import shard_map_step as shard_map_step
from purax.parallel.spmd import split_batch as split_batch
from purax.parallel.spmd import unreplicate as unreplicate
from purax.parallel.spmd import with_axis_name as with_axis_name
from purax.parallel.plan import Plan as Plan
from purax.parallel.step import ShardedPlan as ShardedPlan
from purax.parallel.step import sharded as sharded

__all__ = [
    'AXES',
    'DEFAULT_TABLE',
    'Plan',
    'Rules',
    'ShardedPlan',
    'batch_sharding',
    'batch_shardings',
    'bytes_per_device',
    'data_parallel',
    'distributed',
    'for_mesh',
    'fsdp',
    'logical_axes',
    'make_mesh',
    'parse_mesh',
    'pmap_step',
    'replicate',
    'replicated',
    'shard',
    'shard_map_step',
    'sharded',
    'shardings',
    'split_batch',
    'state_shardings',
    'tensor_parallel',
    'unreplicate',
    'with_axis_name',
]

from purax.core import lazy as _lazy  # noqa: E402

# Spellings before 0.2, still working with a DeprecationWarning until 0.4.
__getattr__, _ = _lazy.attach(__name__, {}, deprecated={
    'Sharded': ('purax.parallel.step:ShardedPlan',
                'purax.parallel.ShardedPlan (purax.parallel.sharded(task, mesh, rules, batch))',
                '0.4'),
})
