"""Plans: how :func:`purax.fit` places the state, runs a step and an
evaluation, and gets batches onto the devices. ``fit`` has one loop; the plan
is what differs, through one protocol (:class:`Plan`, whose methods default
to one device; :mod:`purax.plan.protocol` states it, every member). Batch
staging (copy, stack, prefetch, transfer, and the one "copy this batch?"
decision) is :mod:`purax.plan.feed`. The three plans share one naming
(``init_state``, ``place``, ``train_step``):

- :class:`SingleDevicePlan` (:mod:`purax.plan.single`) — ``jax.jit`` of
  ``task.step`` on one device, optionally ``k`` steps per call (``lax.scan``
  over stacked batches; ``'auto'``: :mod:`purax.plan.auto`); what ``fit``
  uses without a plan;
- :class:`ShardedPlan` (:mod:`purax.plan.sharded`; built by
  :func:`purax.parallel.sharded`) — the same step jitted with
  ``NamedSharding`` in/out shardings on a mesh (data parallel, FSDP, tensor
  parallel), multi-host batches assembled per process;
- :class:`PopulationPlan` (:mod:`purax.plan.members`) — a stacked
  :class:`purax.core.population.Population`: every member's step vmapped in
  one compiled program, metrics ``[members]``.

:func:`fit_memory` (:mod:`purax.plan.memory`) compiles a task's step in
candidate configurations (remat, microbatches, FSDP, precision) and keeps the
fastest whose compiled memory fits the device.

A new plan (pipeline parallel, say) is one subclass of :class:`Plan` that
overrides ``place``, ``train_step`` and what else differs.
"""

from purax.plan import auto as auto
from purax.plan import feed as feed
from purax.plan import memory as memory
from purax.plan.auto import PROBE_STEPS as PROBE_STEPS
from purax.plan.auto import choose_steps_per_call as choose_steps_per_call
from purax.plan.feed import Stacked as Stacked
from purax.plan.feed import host_batch_transfer as host_batch_transfer
from purax.plan.feed import to_step as to_step
from purax.plan.members import PopulationPlan as PopulationPlan
from purax.plan.memory import MemoryFit as MemoryFit
from purax.plan.memory import fit_memory as fit_memory
from purax.plan.protocol import Plan as Plan
from purax.plan.protocol import check_values as check_values
from purax.plan.sharded import ShardedPlan as ShardedPlan
from purax.plan.single import SingleDevicePlan as SingleDevicePlan
from purax.plan.single import multi_train_step as multi_train_step
from purax.plan.single import train_step as train_step

__all__ = [
    'MemoryFit',
    'PROBE_STEPS',
    'Plan',
    'PopulationPlan',
    'ShardedPlan',
    'SingleDevicePlan',
    'Stacked',
    'auto',
    'check_values',
    'choose_steps_per_call',
    'feed',
    'fit_memory',
    'host_batch_transfer',
    'memory',
    'multi_train_step',
    'to_step',
    'train_step',
]

from purax.core import lazy as _lazy  # noqa: E402

# Spellings before 0.2, still working with a DeprecationWarning until 0.4.
__getattr__, _ = _lazy.attach(__name__, {}, deprecated={
    'Population': ('purax.plan.members:PopulationPlan', 'purax.plan.PopulationPlan', '0.4'),
    # Renamed in 0.3: purax.core.population is the population's state and pure functions.
    'population': ('purax.plan.members', 'purax.plan.members', '0.4'),
    'SingleDevice': ('purax.plan.single:SingleDevicePlan', 'purax.plan.SingleDevicePlan',
                     '0.4'),
    'Sharded': ('purax.plan.sharded:ShardedPlan',
                'purax.plan.ShardedPlan (purax.parallel.sharded(task, mesh, rules, batch))',
                '0.4'),
    'MIN_GAIN': ('purax.plan.auto:MIN_GAIN', 'purax.plan.auto.MIN_GAIN', '0.4'),
})
