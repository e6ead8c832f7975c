"""purax.parallel: one step on any mesh, on one host or many.

- :func:`make_mesh` lays out every device of every process on the axes
  ``('data', 'fsdp', 'tensor')``;
- :class:`Rules` (:func:`data_parallel`, :func:`fsdp`, :func:`tensor_parallel`)
  say how each array is split; :func:`shard` places a state or a batch;
- :func:`sharded` builds the plan (:class:`purax.plan.ShardedPlan`,
  :mod:`purax.plan.sharded`) that jits ``init_state`` / ``train_step`` /
  ``evaluate`` with those shardings and the state donated: the step is
  :meth:`purax.Task.step`, unchanged;
- :func:`shard_map_step` and :func:`pmap_step` are the per-device variants
  (explicit gradient ``psum``, BatchNorm ``axis_name``, a dropout key per device);
- :mod:`purax.parallel.distributed` starts multi-host runs on
  ``jax.distributed`` and builds global batches from per-process data.

Nothing here touches a device at import. ``parallel`` imports nothing of
:mod:`purax.plan` (``docs/design.md``, the import table): :func:`sharded`,
:class:`ShardedPlan` and :class:`Plan` are the plans' (:mod:`purax.plan`),
bound here on first use for the spellings before 0.3.
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
__getattr__, __dir__ = _lazy.attach(__name__, {
    # The plans' (purax.plan), bound on first use: parallel imports nothing of plan.
    'Plan': 'purax.plan.protocol:Plan',
    'ShardedPlan': 'purax.plan.sharded:ShardedPlan',
    'sharded': 'purax.plan.sharded:sharded',
}, deprecated={
    'Sharded': ('purax.plan.sharded:ShardedPlan',
                'purax.parallel.ShardedPlan (purax.parallel.sharded(task, mesh, rules, batch))',
                '0.4'),
})
