"""Deprecated since 0.3: the plan protocol moved to :mod:`purax.plan.protocol`
(and batch staging to :mod:`purax.plan.feed`). The names here still work, with
a ``DeprecationWarning`` naming the new home, until 0.4.

``parallel`` keeps meshes, rules, shard_map/pmap and multi-host start-up; it
imports nothing of :mod:`purax.plan` (``docs/design.md``, the import table):
these names are bound on first use (:func:`purax.core.lazy.attach`).
"""

from purax.core import lazy as _lazy

__getattr__, _ = _lazy.attach(__name__, {}, deprecated={
    **{name: (f'purax.plan.protocol:{name}', f'purax.plan.protocol.{name}', '0.4')
       for name in ('Plan', 'check_values')},
    **{name: (f'purax.plan.feed:{name}', f'purax.plan.feed.{name}', '0.4')
       for name in ('host_batch_transfer', 'to_step', 'owned', 'prefetch_to_device')},
})
