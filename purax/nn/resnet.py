"""A small pre-activation-free ResNet with BatchNorm (He et al. 2016).

BatchNorm makes ``model_state`` real: ``{'batch_stats': {...}}`` is updated in
training (``train=True``, mutable) and used unchanged in evaluation. Its
moments are computed in float32 whatever the compute dtype, over the real rows
only (``mask``), and across devices by sums and counts
(:class:`purax.nn.norm.BatchNorm`).
"""

from __future__ import annotations

import functools
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from purax.nn import remat as remat_lib
from purax.nn.norm import BatchNorm


class ResidualBlock(nn.Module):
  """conv-BN-ReLU-conv-BN + (projected) shortcut, ReLU."""

  features: int
  strides: int = 1
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  axis_name: str | tuple[str, ...] | None = None

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None = None) -> jax.Array:
    spatial = x.ndim - 2
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype,
                             param_dtype=self.param_dtype)
    norm = functools.partial(BatchNorm, use_running_average=not train, momentum=0.9,
                             dtype=self.dtype, param_dtype=self.param_dtype,
                             axis_name=self.axis_name)
    strides = (self.strides,) * spatial
    y = conv(self.features, (3,) * spatial, strides=strides)(x)
    y = nn.relu(norm()(y, mask))
    y = conv(self.features, (3,) * spatial)(y)
    y = norm(scale_init=nn.initializers.zeros)(y, mask)
    if x.shape[-1] != self.features or self.strides != 1:
      x = conv(self.features, (1,) * spatial, strides=strides)(x)
      x = norm()(x, mask)
    return nn.relu(x + y)


class ResNet(nn.Module):
  """Stem conv, one residual block per stage, global average pool, dense head.

  Input ``[batch, length, channels]`` or ``[batch, height, width, channels]``;
  output ``[batch, num_classes]`` in ``dtype``.

  Attributes:
    num_classes: number of classes.
    stage_features: channels per stage; every stage after the first halves the
      spatial size (stride 2).
    remat: gradient checkpointing of each residual block, a key of
      :data:`purax.nn.remat.REMAT_POLICIES` ('none', 'full', 'dots_saveable', ...).
    dtype: compute dtype; param_dtype: storage dtype.
    axis_name: for ``pmap`` / ``shard_map`` only: the mapped axis (or axes)
      over which BatchNorm sums its batch statistics' sums and counts, so that
      a split batch normalizes as the global batch does (also when devices
      hold different numbers of real rows). Leave None under ``jax.jit``
      with shardings (the compiler already reduces over the global batch).
  """

  num_classes: int
  stage_features: Sequence[int] = (32, 64)
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  axis_name: str | tuple[str, ...] | None = None
  remat: str = 'none'

  input_ranks = (3, 4)

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False,
               mask: jax.Array | None = None) -> jax.Array:
    """Args:
      x: ``[batch, length, channels]`` or ``[batch, height, width, channels]``.
      train: batch statistics (and their running averages updated) or the
        running averages.
      mask: bool ``[batch]``, False for padding rows: they do not enter the
        batch statistics (the ``purax.Linen`` adapter passes ``weight > 0``). None: all real.

    Returns:
      ``[batch, num_classes]`` logits in ``dtype``.
    """
    spatial = x.ndim - 2
    x = x.astype(self.dtype)
    x = nn.Conv(self.stage_features[0], (3,) * spatial, use_bias=False,
                dtype=self.dtype, param_dtype=self.param_dtype)(x)
    x = BatchNorm(use_running_average=not train, momentum=0.9, dtype=self.dtype,
                  param_dtype=self.param_dtype, axis_name=self.axis_name)(x, mask)
    x = nn.relu(x)
    block = remat_lib.remat(ResidualBlock, self.remat, static_argnums=(2,))
    for i, features in enumerate(self.stage_features):
      x = block(features, strides=1 if i == 0 else 2, dtype=self.dtype,
                param_dtype=self.param_dtype, axis_name=self.axis_name,
                name=f'ResidualBlock_{i}')(x, train, mask)
    x = jnp.mean(x, axis=tuple(range(1, x.ndim - 1)))
    return nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype)(x)
