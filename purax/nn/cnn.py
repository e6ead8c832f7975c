"""A small convolutional network for 1-D signals and 2-D images."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from purax.nn.mlp import dense


class CNN(nn.Module):
  """Conv-ReLU-MaxPool twice, dense 256, dense ``num_classes``.

  Input ``[batch, length, channels]`` (1-D, e.g. MNIST-1D) or
  ``[batch, height, width, channels]`` (2-D, e.g. digits); output
  ``[batch, num_classes]`` in ``dtype``. Kernels are 3 (per spatial axis),
  pooling windows 2 with stride 2 (LeCun et al. 1998 in spirit). Logical axis
  names: conv kernels ``(..., 'conv_in', 'conv_out')``, the dense layer
  ``('embed', 'mlp')``, the head ``('mlp', 'classes')`` (tensor parallel splits
  the hidden layer: one all-reduce of the logits).

  Attributes:
    num_classes: number of classes.
    features: channels of the two conv layers.
    hidden: width of the dense layer.
    dropout_rate: dropout before the head in training.
    dtype: compute dtype; param_dtype: storage dtype of the weights.
  """

  num_classes: int
  features: Sequence[int] = (32, 64)
  hidden: int = 256
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  input_ranks = (3, 4)

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    spatial = x.ndim - 2
    x = x.astype(self.dtype)
    for width in self.features:
      x = nn.Conv(width, (3,) * spatial, dtype=self.dtype, param_dtype=self.param_dtype,
                  kernel_init=nn.with_logical_partitioning(
                      nn.initializers.lecun_normal(),
                      (None,) * spatial + ('conv_in', 'conv_out')),
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                         ('conv_out',)))(x)
      x = nn.relu(x)
      x = nn.max_pool(x, (2,) * spatial, strides=(2,) * spatial, padding='SAME')
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(dense(self.hidden, ('embed', 'mlp'), self.dtype, self.param_dtype)(x))
    if self.dropout_rate > 0:
      x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return dense(self.num_classes, ('mlp', 'classes'), self.dtype, self.param_dtype)(x)
