"""Deprecated since 0.3: the sharded plan moved to :mod:`purax.plan.sharded`
(:class:`purax.plan.ShardedPlan`; :func:`purax.parallel.sharded` still builds
it). The names here still work, with a ``DeprecationWarning`` naming the new
home, until 0.4; ``parallel`` imports nothing of :mod:`purax.plan`
(``docs/design.md``, the import table): they are bound on first use.
"""

from purax.core import lazy as _lazy

__getattr__, _ = _lazy.attach(__name__, {}, deprecated={
    name: (f'purax.plan.sharded:{name}', f'purax.plan.sharded.{name}', '0.4')
    for name in ('ShardedPlan', 'sharded', 'shapes_to_zeros')})
