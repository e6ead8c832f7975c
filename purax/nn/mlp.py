"""A multi-layer perceptron classifier/regressor."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
  """Dense-ReLU(-Dropout) layers, then a dense head.

  Input ``[batch, ...]`` (flattened to ``[batch, features]``); output
  ``[batch, num_classes]`` in ``dtype``. Kernels carry logical axis names,
  alternating ``('embed', 'mlp')`` and ``('mlp', 'embed')``; the head is
  ``(..., 'classes')``.

  Attributes:
    num_classes: output width (classes, or regression targets).
    features: hidden widths.
    dropout_rate: dropout after each hidden layer in training (needs the
      ``'dropout'`` rng).
    dtype: compute dtype; param_dtype: storage dtype of the weights.
  """

  num_classes: int
  features: Sequence[int] = (256, 256)
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  input_ranks = None  # any rank >= 2

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    x = x.reshape(x.shape[0], -1).astype(self.dtype)
    names = ('embed', 'mlp')
    for width in self.features:
      x = dense(width, names, self.dtype, self.param_dtype)(x)
      x = nn.relu(x)
      if self.dropout_rate > 0:
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
      names = names[::-1]      # Megatron pairing: column- then row-parallel
    return dense(self.num_classes, (names[0], 'classes'), self.dtype, self.param_dtype)(x)


def dense(features: int, names: tuple[str, str], dtype, param_dtype) -> nn.Dense:
  """``nn.Dense`` whose kernel ``[in, out]`` and bias ``[out]`` carry logical
  axis names (``names``) for tensor-parallel sharding (purax.parallel)."""
  return nn.Dense(
      features, dtype=dtype, param_dtype=param_dtype,
      kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), names),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), names[1:]))
