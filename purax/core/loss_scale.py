"""Dynamic loss scaling for float16, as pure state (Micikevicius et al. 2018,
"Mixed Precision Training"; the schedule of jmp.DynamicLossScale).

The loss is multiplied by ``scale`` before differentiation and the gradients
divided by it after, so small float16 gradients do not flush to zero. When the
gradients come out non-finite the update is skipped and the scale halved; after
``growth_interval`` finite steps in a row it doubles, capped at ``max_scale``.
The scale is kept in float32, never below 1 and never non-finite.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


class LossScale(struct.PyTreeNode):
  """Loss-scale state.

  Attributes:
    scale: float32 ``[]``, a power of two in ``[1, max_scale]``.
    good_steps: int32 ``[]``, finite steps since the last change.
    growth_interval: finite steps before the scale doubles (static).
    max_scale: cap of the scale (static).
  """

  scale: jax.Array
  good_steps: jax.Array
  growth_interval: int = struct.field(pytree_node=False, default=2000)
  max_scale: float = struct.field(pytree_node=False, default=2.0 ** 24)

  @classmethod
  def create(cls, initial: float = 2.0 ** 15, *, growth_interval: int = 2000,
             max_scale: float = 2.0 ** 24) -> 'LossScale':
    return cls(scale=jnp.asarray(initial, jnp.float32), good_steps=jnp.zeros((), jnp.int32),
               growth_interval=growth_interval, max_scale=max_scale)

  def scale_loss(self, loss: jax.Array) -> jax.Array:
    return loss * self.scale.astype(loss.dtype)

  def unscale(self, grads):
    """Gradients divided by the scale, in float32 (then cast back to each leaf's dtype)."""
    inv = 1.0 / self.scale
    return jax.tree.map(lambda g: (g.astype(jnp.float32) * inv).astype(g.dtype), grads)

  def update(self, finite: jax.Array) -> 'LossScale':
    """The next state: halve on non-finite gradients, double after a finite run."""
    grow = jnp.logical_and(finite, self.good_steps + 1 >= self.growth_interval)
    scale = jnp.where(finite, jnp.where(grow, self.scale * 2.0, self.scale), self.scale * 0.5)
    scale = jnp.clip(scale, 1.0, self.max_scale)
    good = jnp.where(finite, jnp.where(grow, 0, self.good_steps + 1), 0)
    return self.replace(scale=scale.astype(jnp.float32), good_steps=good.astype(jnp.int32))

