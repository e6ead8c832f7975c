"""Multi-head self-attention through ``jax.nn.dot_product_attention``.

One module, :class:`SelfAttention`, serves the encoder (bidirectional), the
decoder (causal) and decoding with a KV cache. The attention kernel is chosen
for the device, with nothing for the user to set: cuDNN's fused
flash-attention on an NVIDIA GPU when the compute dtype is bfloat16 or float16
(and the head size suits it), XLA's reference implementation everywhere else
(:func:`attention_implementation`). Both compute the softmax in float32.

Rotary position embeddings (:func:`apply_rope`) are applied to queries and
keys in float32 (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary
Position Embedding", arXiv:2104.09864).

Logical axis names (for :mod:`purax.parallel`'s rule table): the fused
query/key/value kernel is ``[embed, 3, heads, kv]`` named
``('embed', None, 'heads', 'kv')`` and the output kernel ``[heads, kv, embed]``
named ``('heads', 'kv', 'embed')``: tensor parallel splits the heads (Megatron,
Shoeybi et al. 2019), one all-reduce per attention block.
"""

from __future__ import annotations

import re
import warnings
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from purax.core.precision import standard_promotion
from purax.nn import fp8

Implementation = Literal['xla', 'cudnn']

#: Initialisation of every projection (GPT-2: normal, standard deviation 0.02).
INIT_STD = 0.02


def attention_implementation(dtype, head_dim: int, backend: str | None = None,
                             seq_len: int | None = None) -> Implementation:
  """The attention kernel for this device: ``'cudnn'`` or ``'xla'``.

  cuDNN's fused attention (flash attention, Dao et al. 2022) runs only on
  NVIDIA GPUs, in bfloat16 or float16, with a head size that is a multiple of
  8 and at most 128, and (for its backward pass) an even sequence length;
  every other case uses XLA's implementation. The sequence-length rule is
  checked by jax only when the step is differentiated, after the forward
  pass was traced, so it must be known here: a fallback could not catch it.

  Args:
    dtype: the compute dtype of queries, keys and values.
    head_dim: the size of one head.
    backend: ``jax.default_backend()`` when None (``'cpu'``, ``'gpu'``, ``'tpu'``).
    seq_len: the query (= key) length; None skips that rule.

  Returns:
    The ``implementation=`` argument of ``jax.nn.dot_product_attention``.
  """
  backend = jax.default_backend() if backend is None else backend
  if (backend in ('gpu', 'cuda') and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
      and head_dim % 8 == 0 and head_dim <= 128 and (seq_len is None or seq_len % 2 == 0)):
    return 'cudnn'
  return 'xla'


def attend(q, k, v, *, causal: bool, implementation: Implementation,
           fallback: bool = True) -> jax.Array:
  """``jax.nn.dot_product_attention`` on ``[batch, seq, heads, head_dim]``.

  With ``fallback``, when jax refuses the cuDNN kernel while tracing (no cuDNN
  or an old one, an unsupported GPU, head size or batching: ``RuntimeError``
  or ``NotImplementedError``) XLA's kernel is used instead, with an
  :class:`AttentionFallbackWarning` that names the reason, so a model whose
  kernel was chosen automatically never fails for want of the fast path, and
  never loses it silently either. (A failure later, when XLA compiles the
  cuDNN graph, is not caught.) :func:`kernels_in_hlo` tells which kernel a
  compiled step really calls.

  Raises:
    RuntimeError, NotImplementedError: from jax's cuDNN kernel, without
      ``fallback``.
  """
  if implementation == 'cudnn':
    try:
      return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation='cudnn')
    except (RuntimeError, NotImplementedError) as e:
      if not fallback:
        raise
      warnings.warn(f"cuDNN attention is unavailable for q {q.dtype}{list(q.shape)} "
                    f"({type(e).__name__}: {e}); using XLA's kernel", AttentionFallbackWarning,
                    stacklevel=2)
  return _xla_attention(q, k, v, is_causal=causal)


@standard_promotion    # jax's kernel promotes bfloat16 against float32 logits
def _xla_attention(q, k, v, **kwargs) -> jax.Array:
  """XLA's kernel; float16 is computed in float32 off the GPU (XLA's CPU dot has
  no float16 x float16 -> float32 form), output cast back to float16."""
  if q.dtype == jnp.float16 and jax.default_backend() not in ('gpu', 'cuda'):
    out = jax.nn.dot_product_attention(q.astype(jnp.float32), k.astype(jnp.float32),
                                       v.astype(jnp.float32), implementation='xla', **kwargs)
    return out.astype(jnp.float16)
  return jax.nn.dot_product_attention(q, k, v, implementation='xla', **kwargs)


class AttentionFallbackWarning(UserWarning):
  """The automatically chosen cuDNN attention kernel could not be built."""


#: Custom-call targets of cuDNN's fused attention in compiled HLO (forward,
#: backward): ``__cudnn$fmhaSoftmax``, ``__cudnn$fmhaSoftmaxBackward``, ...
CUDNN_ATTENTION_TARGET = re.compile(r'__cudnn\$fmha\w*')


def kernels_in_hlo(hlo_text: str) -> list[str]:
  """The cuDNN fused-attention custom calls in ``hlo_text``, sorted, deduplicated.

  Args:
    hlo_text: ``jax.jit(f).lower(...).as_text()`` or ``.compile().as_text()``.

  Returns:
    e.g. ``['__cudnn$fmhaSoftmax', '__cudnn$fmhaSoftmaxBackward']`` for a
    training step on cuDNN attention; ``[]`` when attention runs on XLA's kernel.
  """
  return sorted(set(CUDNN_ATTENTION_TARGET.findall(hlo_text)))


def rope_angles(positions: jax.Array, head_dim: int, base: float = 10000.0):
  """``(cos, sin)`` float32 ``[batch, seq, 1, head_dim // 2]`` of rotary embeddings.

  Args:
    positions: int ``[batch, seq]`` (or ``[seq]``) absolute token positions.
    head_dim: the (even) size of one head.
    base: the wavelength base (10,000 in Su et al. 2021).

  Precision: the angles ``position * theta_i`` are float32, so they carry an
  absolute error of about ``position * 6e-8`` radians (measured against
  float64: 3e-5 at position 1024, 3e-4 at 8192, 4e-3 at 100,000) — as in the
  reference implementations; no range reduction is attempted.
  """
  inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
  positions = positions if positions.ndim == 2 else positions[None]
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None]
  angles = angles[:, :, None, :]
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates ``x`` ``[batch, seq, heads, head_dim]`` by position, in float32.

  The two halves of each head are rotated as pairs (the "rotate half"
  convention of GPT-NeoX and LLaMA). Returns ``x``'s dtype.
  """
  dtype = x.dtype
  x = x.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(dtype)


def param_with_names(module: nn.Module, name: str, shape, names, dtype,
                     stddev: float = INIT_STD) -> jax.Array:
  """A normally initialised parameter carrying logical axis ``names``."""
  init = nn.with_logical_partitioning(nn.initializers.normal(stddev), names)
  return module.param(name, init, shape, dtype)


class SelfAttention(nn.Module):
  """Multi-head self-attention (Vaswani et al. 2017, "Attention Is All You Need").

  Input ``[batch, seq, embed]``; output ``[batch, seq, embed]`` in ``dtype``.

  With ``decode=True`` keys and values are written to a ``'cache'`` collection
  (``cached_key``, ``cached_value``: ``[batch, max_len, heads, head_dim]``) at
  ``cache_index``, and the ``seq`` new queries attend to every cached position
  up to their own: the prompt may be fed in one call (prefill) and then one
  token per call. Create the cache by calling the model with ``decode=True``
  on an input of ``[batch, max_len]`` under ``init`` (or ``jax.eval_shape``).

  Attributes:
    num_heads: number of heads; embed must be divisible by it.
    causal: position t attends only to positions <= t.
    rope: apply rotary position embeddings to queries and keys.
    decode: use and update the KV cache.
    implementation: the attention kernel; None chooses for the device
      (:func:`attention_implementation`).
    out_stddev: initial standard deviation of the output projection.
    fp8: the query/key/value and output projections in float8
      (:func:`purax.nn.fp8.matmul`); attention itself stays in ``dtype``.
    dtype: compute dtype; param_dtype: storage dtype.
  """

  num_heads: int
  causal: bool = False
  rope: bool = False
  decode: bool = False
  implementation: Implementation | None = None
  out_stddev: float = INIT_STD
  rope_base: float = 10000.0
  fp8: bool = False
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, positions: jax.Array | None = None,
               cache_index: jax.Array | None = None) -> jax.Array:
    """Args:
      x: ``[batch, seq, embed]``.
      positions: int32 ``[batch, seq]`` absolute positions (for rope).
      cache_index: int32 ``[]`` first cache slot written (decode only).
    """
    batch, seq, embed = x.shape
    head_dim = embed // self.num_heads
    qkv_kernel = param_with_names(self, 'qkv', (embed, 3, self.num_heads, head_dim),
                                  ('embed', None, 'heads', 'kv'), self.param_dtype)
    qkv_bias = self.param('qkv_bias', nn.with_logical_partitioning(
        nn.initializers.zeros_init(), (None, 'heads', 'kv')),
        (3, self.num_heads, head_dim), self.param_dtype)
    out_kernel = param_with_names(self, 'out', (self.num_heads, head_dim, embed),
                                  ('heads', 'kv', 'embed'), self.param_dtype,
                                  self.out_stddev)
    out_bias = self.param('out_bias', nn.with_logical_partitioning(
        nn.initializers.zeros_init(), ('embed',)), (embed,), self.param_dtype)
    x = x.astype(self.dtype)
    if self.fp8:
      qkv = fp8.matmul(x, qkv_kernel.astype(self.dtype).reshape(embed, -1))
      qkv = jnp.moveaxis(qkv.reshape(batch, seq, 3, self.num_heads, head_dim), 2, 0)
    else:
      qkv = jnp.einsum('bsd,dkhf->kbshf', x, qkv_kernel.astype(self.dtype))
    qkv = qkv + qkv_bias.astype(self.dtype)[:, None, None]
    q, k, v = qkv[0], qkv[1], qkv[2]
    if self.rope:
      cos, sin = rope_angles(positions, head_dim, self.rope_base)
      q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if self.decode:
      out = self._decode(q, k, v, cache_index)
    else:
      out = attend(q, k, v, causal=self.causal,
                   implementation=self.implementation
                   or attention_implementation(self.dtype, head_dim, seq_len=seq),
                   fallback=self.implementation is None)
    if self.fp8:
      out = fp8.matmul(out.reshape(batch, seq, embed),
                       out_kernel.astype(self.dtype).reshape(embed, embed))
    else:
      out = jnp.einsum('bshf,hfd->bsd', out, out_kernel.astype(self.dtype))
    return out + out_bias.astype(self.dtype)[None, None]

  def _decode(self, q, k, v, cache_index):
    """Writes k, v at ``cache_index`` and attends to the cache (XLA kernel)."""
    initialized = self.has_variable('cache', 'cached_key')
    cached_k = self.variable('cache', 'cached_key', jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable('cache', 'cached_value', jnp.zeros, v.shape, v.dtype)
    if not initialized:   # creating the cache: the input's length is its size
      return _xla_attention(q, k, v, is_causal=self.causal)
    index = jnp.asarray(cache_index, jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    keys = jax.lax.dynamic_update_slice(cached_k.value, k.astype(cached_k.value.dtype),
                                        (zero, index, zero, zero))
    values = jax.lax.dynamic_update_slice(cached_v.value, v.astype(cached_v.value.dtype),
                                          (zero, index, zero, zero))
    cached_k.value, cached_v.value = keys, values
    seq, max_len = q.shape[1], keys.shape[1]
    query_pos = index + jnp.arange(seq, dtype=jnp.int32)
    key_pos = jnp.arange(max_len, dtype=jnp.int32)
    visible = key_pos[None, :] <= query_pos[:, None]          # [seq, max_len]
    if not self.causal:
      visible = key_pos[None, :] < (index + seq)
      visible = jnp.broadcast_to(visible, (seq, max_len))
    return _xla_attention(q, keys, values, mask=visible[None, None])
