"""A small pre-activation-free ResNet with BatchNorm (He et al. 2016).

BatchNorm makes ``model_state`` real: ``{'batch_stats': {...}}`` is updated in
training (``train=True``, mutable) and used unchanged in evaluation. Its
moments are computed in float32 whatever the compute dtype.
"""

from __future__ import annotations

import functools
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class ResidualBlock(nn.Module):
  """conv-BN-ReLU-conv-BN + (projected) shortcut, ReLU."""

  features: int
  strides: int = 1
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    spatial = x.ndim - 2
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype,
                             param_dtype=self.param_dtype)
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                             dtype=self.dtype, param_dtype=self.param_dtype)
    strides = (self.strides,) * spatial
    y = conv(self.features, (3,) * spatial, strides=strides)(x)
    y = nn.relu(norm()(y))
    y = conv(self.features, (3,) * spatial)(y)
    y = norm(scale_init=nn.initializers.zeros)(y)
    if x.shape[-1] != self.features or self.strides != 1:
      x = conv(self.features, (1,) * spatial, strides=strides)(x)
      x = norm()(x)
    return nn.relu(x + y)


class ResNet(nn.Module):
  """Stem conv, one residual block per stage, global average pool, dense head.

  Input ``[batch, length, channels]`` or ``[batch, height, width, channels]``;
  output ``[batch, num_classes]`` in ``dtype``.

  Attributes:
    num_classes: number of classes.
    stage_features: channels per stage; every stage after the first halves the
      spatial size (stride 2).
    dtype: compute dtype; param_dtype: storage dtype.
  """

  num_classes: int
  stage_features: Sequence[int] = (32, 64)
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  input_ranks = (3, 4)

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    spatial = x.ndim - 2
    x = x.astype(self.dtype)
    x = nn.Conv(self.stage_features[0], (3,) * spatial, use_bias=False,
                dtype=self.dtype, param_dtype=self.param_dtype)(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9, dtype=self.dtype,
                     param_dtype=self.param_dtype)(x)
    x = nn.relu(x)
    for i, features in enumerate(self.stage_features):
      x = ResidualBlock(features, strides=1 if i == 0 else 2, dtype=self.dtype,
                        param_dtype=self.param_dtype)(x, train=train)
    x = jnp.mean(x, axis=tuple(range(1, x.ndim - 1)))
    return nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype)(x)
