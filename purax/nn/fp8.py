"""Float8 matmuls with current scaling, for the tensor cores of H100/H200 GPUs.

:func:`matmul` computes ``x @ w`` from float8 operands: the input and the
weight in ``float8_e4m3fn`` (3 mantissa bits, range +-448), the incoming
gradient of the backward pass in ``float8_e5m2`` (2 mantissa bits, range
+-57344), each divided by its own scale first, the products accumulated
and returned in the compute dtype and multiplied back by the two scales
(Micikevicius et al. 2022, "FP8 Formats for Deep Learning",
arXiv:2209.05433). The scale of a tensor is its current absolute maximum
over the format's largest value (*current* or *just-in-time* scaling, as
torchao's tensorwise recipe), so no scale or amax history is kept: the
state and the step stay what they are in bfloat16, a population vmaps
over members each with its own scales, and a checkpoint holds no float8
metadata. (flax's ``Fp8DirectDotGeneralOp`` keeps delayed scales in an
``_overwrite_with_gradient`` collection instead, which an optimizer must
treat specially.) The cost of current scaling is one reduction over each
operand before it is cast (on a mesh, a scalar all-reduce across the
operand's shards: the scale is the whole tensor's).

XLA's GPU compiler runs a ``dot_general`` of float8 operands as a cuBLASLt
float8 GEMM on compute capability 8.9 and later (Ada, Hopper); elsewhere it
upcasts the operands (XLA:CPU runs this module's matmuls in float32 from the
float8 values: the same products to rounding, at no speed gain), so a model
built with ``fp8=True`` trains and is tested anywhere and is fast where the
hardware has float8 units. The ``fp8`` precision policy warns where it would
not be (:func:`purax.core.precision.float8_upcast`).

Which matmuls: :class:`purax.nn.transformer.DecoderLM` and
:class:`~purax.nn.transformer.TransformerEncoder` with ``fp8=True`` (the
``fp8`` precision preset, :mod:`purax.core.precision`) run the attention's
query/key/value and output projections and both MLP matmuls through
:func:`matmul`; the embedding, the output logits and attention itself stay
in the compute dtype (the usual recipe: the logits' range and the softmax
need more than float8).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

#: Forward operands (inputs and weights) and backward operands (gradients).
FORWARD, BACKWARD = jnp.float8_e4m3fn, jnp.float8_e5m2


def scale_of(x: jax.Array, dtype) -> jax.Array:
  """float32 ``[]``: ``max|x| / finfo(dtype).max`` (1 when that is 0 or not
  finite), so that ``x / scale`` fills ``dtype``'s range; no gradient."""
  amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
  fmax = float(jnp.finfo(dtype).max)
  ok = jnp.isfinite(amax) & (amax > 0)
  return jax.lax.stop_gradient(jnp.where(ok, amax / fmax, 1.0))


def quantize(x: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
  """``(q, scale)``: ``x / scale`` cast to ``dtype``, finite values clipped
  to its range (the largest magnitude lands on it, and rounding must not
  carry it past: ``float8_e4m3fn`` has no infinity); ``q * scale``
  approximates ``x``. A NaN or infinity in ``x`` becomes NaN (not a clipped
  finite value: the non-finite guard must see it)."""
  scale = scale_of(x, dtype)
  fmax = float(jnp.finfo(dtype).max)
  scaled = x.astype(jnp.float32) / scale
  finite = jnp.where(jnp.isfinite(scaled), jnp.clip(scaled, -fmax, fmax), jnp.nan)
  return finite.astype(dtype), scale


def _dot(a, b, contract_a: int, contract_b: int, out_dtype, scale):
  """``a . b`` over one axis each, accumulated in ``out_dtype``, times ``scale``."""
  out = jax.lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())),
                            preferred_element_type=out_dtype)
  return out * scale.astype(out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul(x, w, x_dtype, w_dtype):
  qx, sx = quantize(x, FORWARD)
  qw, sw = quantize(w, FORWARD)
  return _dot(qx, qw, x.ndim - 1, 0, x_dtype, sx * sw)


def _matmul_fwd(x, w, x_dtype, w_dtype):
  qx, sx = quantize(x, FORWARD)
  qw, sw = quantize(w, FORWARD)
  # The float8 operands are what the backward pass keeps: half the bytes of bfloat16.
  return _dot(qx, qw, x.ndim - 1, 0, x_dtype, sx * sw), (qx, sx, qw, sw)


def _matmul_bwd(x_dtype, w_dtype, residuals, g):
  qx, sx, qw, sw = residuals
  qg, sg = quantize(g, BACKWARD)
  dx = _dot(qg, qw, g.ndim - 1, 1, x_dtype, sg * sw)                 # [..., k]
  flat_x = qx.reshape(-1, qx.shape[-1])                              # [m, k]
  flat_g = qg.reshape(-1, qg.shape[-1])                              # [m, n]
  dw = _dot(flat_x, flat_g, 0, 0, jnp.float32, sx * sg).astype(w_dtype)   # [k, n]
  return dx, dw


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
  """``x @ w`` from float8 operands (see the module docstring).

  Args:
    x: ``[..., k]`` in the compute dtype (bfloat16 or float16; float32 is
      accepted).
    w: ``[k, n]``, the weight, already cast to the compute dtype.

  Returns:
    ``[..., n]`` in ``x.dtype``. The gradient with respect to ``x`` is in
    ``x.dtype``, with respect to ``w`` in ``w.dtype`` (accumulated in float32).

  Example:
    >>> import jax.numpy as jnp
    >>> from purax.nn import fp8
    >>> x, w = jnp.ones((2, 8, 4), jnp.bfloat16), jnp.full((4, 3), 0.5, jnp.bfloat16)
    >>> y = fp8.matmul(x, w)
    >>> y.shape, y.dtype, float(y[0, 0, 0])
    ((2, 8, 3), dtype(bfloat16), 2.0)
  """
  return _matmul(x, w, jnp.dtype(x.dtype), jnp.dtype(w.dtype))
