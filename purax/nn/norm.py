"""Batch normalization whose statistics count only real rows, on every path.

:class:`BatchNorm` keeps flax's variable layout (params ``scale``, ``bias``;
``batch_stats`` ``mean``, ``var``, all ``[features]``) and differs from
``flax.linen.BatchNorm`` in how the batch moments are reduced
(:func:`masked_moments`):

- a ``mask`` (bool ``[batch]``, False for padding) removes rows from the
  moments, so a padded batch normalizes and updates the running statistics
  exactly as its real rows alone would;
- under ``axis_name`` (``pmap`` / ``shard_map``) the per-device *sums and
  counts* are ``psum``-ed, not the per-device means averaged: devices holding
  different numbers of real rows still give the global batch's moments
  (flax's ``mask=`` with ``axis_name`` takes a ``pmean`` of per-device masked
  means, and a device with no real row contributes NaN);
- the variance is two-pass, ``mean((x - mean)^2)``, in float32: flax's default
  ``E[x^2] - E[x]^2`` cancels catastrophically for features with a large
  offset (1e4 + noise of 0.1 in float32 gives a variance of 0 or a few units);
- a batch with no real row at all leaves the running statistics unchanged.

Ioffe & Szegedy 2015, "Batch Normalization".
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from purax.core.losses import at_least_float32, float32_or_wider


def masked_moments(x: jax.Array, mask: jax.Array | None = None,
                   axis_name: Any = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``(mean, var, count)`` of ``x`` over every axis but the last, real rows only.

  Args:
    x: ``[batch, ..., features]``; the moments are computed in (at least)
      float32 whatever its dtype.
    mask: bool ``[batch]`` (or ``[batch, ...]``, a prefix of ``x``'s shape);
      None counts every row.
    axis_name: a mapped axis (or axes) under ``pmap`` / ``shard_map`` whose
      devices together hold the batch: sums and counts are ``psum``-ed.

  Returns:
    float32 ``mean`` and ``var`` ``[features]`` (biased, two-pass), and the
    float32 ``count`` ``[]`` of values per feature they were computed from
    (0 when no row is real: then mean and var are 0, not NaN).
  """
  x = at_least_float32(x)
  axes = tuple(range(x.ndim - 1))
  if mask is None:
    m = jnp.ones((1,) * x.ndim, x.dtype)
    count = jnp.asarray(math.prod(x.shape[:-1]), x.dtype)
  else:
    m = jnp.asarray(mask).astype(x.dtype)
    m = jnp.broadcast_to(jnp.reshape(m, m.shape + (1,) * (x.ndim - 1 - m.ndim)),
                         x.shape[:-1])[..., None]
    count = jnp.sum(m)
  total = jnp.sum(x * m, axis=axes)
  if axis_name is not None:
    total, count = jax.lax.psum((total, count), axis_name)
  safe = jnp.maximum(count, 1.0)
  mean = total / safe
  centred = (x - jnp.reshape(mean, (1,) * (x.ndim - 1) + mean.shape)) * m
  sq = jnp.sum(centred * centred, axis=axes)
  if axis_name is not None:
    sq = jax.lax.psum(sq, axis_name)
  return mean, sq / safe, count


class BatchNorm(nn.Module):
  """Batch normalization over every axis but the last, padding- and device-aware.

  Drop-in for ``flax.linen.BatchNorm`` (same variables, same running-average
  update ``momentum * old + (1 - momentum) * batch``); see the module doc for
  what differs.

  Attributes:
    use_running_average: normalize with the running statistics (evaluation)
      instead of the batch's (training, which also updates them).
    momentum: decay of the running statistics.
    epsilon: added to the variance.
    dtype: output dtype (the statistics are float32); param_dtype: of scale
      and bias.
    axis_name: under ``pmap`` / ``shard_map``, the axis (or axes) the batch is
      split over; None under ``jax.jit`` with shardings (the compiler reduces
      over the global batch).
    scale_init, bias_init: initializers of ``scale`` and ``bias`` (None: ones
      and zeros).
  """

  use_running_average: bool = False
  momentum: float = 0.99
  epsilon: float = 1e-5
  dtype: Any = None
  param_dtype: Any = jnp.float32
  axis_name: Any = None
  scale_init: Any = None
  bias_init: Any = None

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Args:
      x: ``[batch, ..., features]``.
      mask: bool ``[batch]``, False for padded rows (ignored with running
        averages).

    Returns:
      ``[batch, ..., features]`` in ``dtype`` (None: ``x``'s dtype promoted with ``param_dtype``,
      as flax's).
    """
    features = x.shape[-1]
    ra_mean = self.variable('batch_stats', 'mean', lambda: jnp.zeros((features,), jnp.float32))
    ra_var = self.variable('batch_stats', 'var', lambda: jnp.ones((features,), jnp.float32))
    if self.use_running_average:
      mean, var = ra_mean.value, ra_var.value
    else:
      initializing = self.is_initializing()
      mean, var, count = masked_moments(x, mask, None if initializing else self.axis_name)
      if not initializing:
        any_real = count > 0
        ra_mean.value = jnp.where(
            any_real, self.momentum * ra_mean.value + (1 - self.momentum) * mean,
            ra_mean.value)
        ra_var.value = jnp.where(
            any_real, self.momentum * ra_var.value + (1 - self.momentum) * var,
            ra_var.value)
    scale = self.param('scale', self.scale_init or nn.initializers.ones, (features,),
                       self.param_dtype)
    bias = self.param('bias', self.bias_init or nn.initializers.zeros, (features,),
                      self.param_dtype)
    ct = float32_or_wider(x.dtype)    # statistics' dtype
    mul = jax.lax.rsqrt(var.astype(ct) + self.epsilon) * scale.astype(ct)
    shape = (1,) * (x.ndim - 1) + (features,)
    y = ((x.astype(ct) - jnp.reshape(mean.astype(ct), shape)) * jnp.reshape(mul, shape)
         + jnp.reshape(bias.astype(ct), shape))
    if self.dtype is None:   # flax's rule for the output, asked for also under strict promotion
      with jax.numpy_dtype_promotion('standard'):
        return y.astype(jnp.promote_types(x.dtype, self.param_dtype))
    return y.astype(self.dtype)
