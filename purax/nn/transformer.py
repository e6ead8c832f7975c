"""Transformers: a classifying encoder and a decoder-only language model.

Both stack ``num_layers`` identical :class:`Block` s, scanned or unrolled
(:func:`scans`): scanned with ``nn.scan`` (one traced layer, parameters
stacked on a leading ``'layers'`` axis), compilation time does not grow with
depth; unrolled into ``layers_0 ... layers_{L-1}`` (the same computation), a
shallow stack runs faster and needs less temporary memory. ``scan_layers``
chooses; unset (None) it is scanned above :data:`SCAN_LAYERS_ABOVE` layers.
``remat`` recomputes activations in the backward pass under a
``jax.checkpoint`` policy (:data:`purax.nn.remat.REMAT_POLICIES`), per block.

Precision: parameters are stored in ``param_dtype`` and cast to ``dtype`` for
the matmuls; LayerNorm statistics and the attention softmax are computed in
float32 whatever ``dtype`` is (flax's LayerNorm promotes its moments to
float32, two-pass; ``jax.nn.dot_product_attention`` normalises in float32).

Logical axis names: embeddings ``('vocab', 'embed')``, MLP kernels
``('embed', 'mlp')`` / ``('mlp', 'embed')``, attention as in
:mod:`purax.nn.attention`, LayerNorm ``('embed',)``; scanned parameters get a
leading ``'layers'`` axis.

References: Vaswani et al. 2017, "Attention Is All You Need" (the block);
Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"
(GPT-2: pre-LayerNorm, tied embeddings, scaled residual initialisation);
Su et al. 2021, RoFormer (rotary positions).
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from purax.core import losses
from purax.core.errors import ConfigError, DataError, expect
from purax.nn import fp8
from purax.nn.attention import INIT_STD, Implementation, SelfAttention, param_with_names
from purax.nn.remat import REMAT_POLICIES, check_remat

#: With ``scan_layers=None`` (auto) a stack of more layers than this is
#: scanned (compile time flat with depth), a shallower one unrolled (faster
#: and lighter; the measurements: ``benchmarks/README.md``, "Scanned or
#: unrolled layers").
SCAN_LAYERS_ABOVE = 24


def scans(num_layers: int, scan_layers: bool | None) -> bool:
  """Whether a stack of ``num_layers`` blocks is scanned (``nn.scan``).

  The one place the choice is made: the parameter layout (``layers/...`` with
  a leading ``[num_layers]`` axis when scanned, ``layers_{i}/...`` when
  unrolled) and the KV cache's follow from it.

  Args:
    num_layers: depth of the stack.
    scan_layers: True (scanned) or False (unrolled) as asked; None (auto):
      scanned iff ``num_layers > SCAN_LAYERS_ABOVE``.

  Returns:
    True when scanned.
  """
  if scan_layers is None:
    return num_layers > SCAN_LAYERS_ABOVE
  return bool(scan_layers)


class LayerNorm(nn.LayerNorm):
  """LayerNorm over the last axis (Ba et al. 2016): float32 statistics in one
  pass over ``x``, robust to a large common offset; output in ``dtype``.

  ``flax.linen.LayerNorm``'s fast variance ``E[y^2] - E[y]^2``, of ``y = x -
  x[..., :1]``: each row shifted by its first feature (a constant for
  differentiation; the normalization does not depend on it). Shifting by a
  value of the row removes any offset the features share before squaring
  (the shifted-data algorithm; Chan, Golub & LeVeque 1983, "Algorithms for
  computing the sample variance"), so a residual stream at 1e4 with spread
  0.1 normalizes right, where the unshifted fast form cancels to errors of
  hundreds; and both sums come from one read, where the exact two-pass
  ``mean((y - mean)^2)`` reads it twice. Measured on the LM of
  ``benchmarks/lm.py --config cpu`` (9 LayerNorms): the two-pass form stepped
  ~12% slower; so did this same shifted formula written out by hand
  (``(y - mean) * r * scale``, or as a ``custom_jvp``): XLA:CPU fuses flax's
  ``y * (r * scale)`` form best.

  Parameters and their names as ``flax.linen.LayerNorm``'s: ``scale`` (ones)
  and ``bias`` (zeros), ``[features]`` (:func:`layer_norm` gives them the
  logical axis ``'embed'``).
  """

  epsilon: float = 1e-5
  use_fast_variance: bool = True

  def __call__(self, x: jax.Array, *args, **kwargs) -> jax.Array:
    x = losses.at_least_float32(x)
    with jax.numpy_dtype_promotion('standard'):   # flax's, mixing its dtype and param_dtype
      return super().__call__(x - jax.lax.stop_gradient(x[..., :1]), *args, **kwargs)


def layer_norm(dtype, param_dtype, name=None) -> LayerNorm:
  """The blocks' :class:`LayerNorm` (epsilon 1e-5)."""
  return LayerNorm(
      dtype=dtype, param_dtype=param_dtype, name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ('embed',)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ('embed',)))


class MLP(nn.Module):
  """``Dense(ratio * embed)``-GELU-``Dense(embed)`` on ``[batch, seq, embed]``
  (both matmuls in float8 with ``fp8``: :func:`purax.nn.fp8.matmul`)."""

  ratio: int = 4
  out_stddev: float = INIT_STD
  fp8: bool = False
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    embed = x.shape[-1]
    hidden = self.ratio * embed
    w1 = param_with_names(self, 'wi', (embed, hidden), ('embed', 'mlp'), self.param_dtype)
    b1 = self.param('bi', nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                       ('mlp',)), (hidden,), self.param_dtype)
    w2 = param_with_names(self, 'wo', (hidden, embed), ('mlp', 'embed'), self.param_dtype,
                          self.out_stddev)
    b2 = self.param('bo', nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                       ('embed',)), (embed,), self.param_dtype)
    dot = fp8.matmul if self.fp8 else functools.partial(jnp.einsum, '...d,dh->...h')
    h = dot(x.astype(self.dtype), w1.astype(self.dtype))
    h = nn.gelu(h + b1.astype(self.dtype)[None, None])
    out = dot(h, w2.astype(self.dtype))
    return out + b2.astype(self.dtype)[None, None]


class Block(nn.Module):
  """One Transformer layer: attention and MLP, each with dropout and a residual.

  ``pre_norm=False`` is the original post-LayerNorm block of Vaswani et al.
  (``x = LN(x + Dropout(Attention(x)))``, then the same with the MLP);
  ``pre_norm=True`` is GPT-2's (``x = x + Dropout(Attention(LN(x)))``).
  Returns ``(x, None)`` so that ``nn.scan`` can carry ``x``.
  """

  num_heads: int
  mlp_ratio: int = 4
  dropout_rate: float = 0.0
  deterministic: bool = True
  causal: bool = False
  rope: bool = False
  pre_norm: bool = True
  decode: bool = False
  implementation: Implementation | None = None
  out_stddev: float = INIT_STD
  fp8: bool = False
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, positions=None, cache_index=None):
    attention = SelfAttention(self.num_heads, causal=self.causal, rope=self.rope,
                              decode=self.decode, implementation=self.implementation,
                              out_stddev=self.out_stddev, fp8=self.fp8, dtype=self.dtype,
                              param_dtype=self.param_dtype, name='attention')
    mlp = MLP(self.mlp_ratio, self.out_stddev, self.fp8, self.dtype, self.param_dtype,
              name='mlp')
    drop = lambda h: nn.Dropout(self.dropout_rate, deterministic=self.deterministic)(h)
    norm1 = layer_norm(self.dtype, self.param_dtype, 'norm1')
    norm2 = layer_norm(self.dtype, self.param_dtype, 'norm2')
    if self.pre_norm:
      x = x + drop(attention(norm1(x), positions, cache_index))
      x = x + drop(mlp(norm2(x)))
    else:
      x = norm1(x + drop(attention(x, positions, cache_index)))
      x = norm2(x + drop(mlp(x)))
    return x, None


def stack(parent_kwargs: dict, *, num_layers: int, scan_layers: bool | None, remat: str,
          x: jax.Array, positions=None, cache_index=None) -> jax.Array:
  """Applies ``num_layers`` :class:`Block` s (inside a parent's compact method).

  Scanned (``scans(num_layers, scan_layers)``): parameters ``layers/...`` with
  a leading ``[num_layers]`` axis (logical name ``'layers'``) and one traced
  layer. Unrolled: ``layers_{i}``.
  """
  scan_layers = scans(num_layers, scan_layers)
  block = Block
  if remat != 'none' and not parent_kwargs.get('decode', False):
    block = nn.remat(Block, policy=REMAT_POLICIES[remat], prevent_cse=not scan_layers)
  if scan_layers:
    layers = nn.scan(block, variable_axes={'params': 0, 'cache': 0},
                     split_rngs={'params': True, 'dropout': True},
                     in_axes=(nn.broadcast, nn.broadcast), length=num_layers,
                     metadata_params={nn.PARTITION_NAME: 'layers'})
    x, _ = layers(**parent_kwargs, name='layers')(x, positions, cache_index)
    return x
  for i in range(num_layers):
    x, _ = block(**parent_kwargs, name=f'layers_{i}')(x, positions, cache_index)
  return x


def _check(module, d_model, num_heads, remat, rope=False):
  expect(d_model % num_heads == 0, f'{type(module).__name__}.d_model',
         f'a multiple of num_heads ({num_heads})', d_model, ConfigError)
  expect(not rope or (d_model // num_heads) % 2 == 0,
         f'{type(module).__name__}.d_model / num_heads (the head size)',
         'even, for rotary positions', f'{d_model} / {num_heads} = {d_model // num_heads}',
         ConfigError)
  check_remat(remat)


class TransformerEncoder(nn.Module):
  """A Transformer encoder classifier (Vaswani et al. 2017), mean-pooled.

  Input ``[batch, seq, features]`` float (higher ranks are flattened after the
  sequence axis, ``[batch, features]`` becomes ``[batch, features, 1]``: for
  the 8x8 digits, the 8 rows are a sequence of 8 tokens of 8 features).
  Tokens are projected to ``d_model``, a learned position embedding
  ``[seq, d_model]`` is added, ``num_layers`` post-LN blocks run, the sequence
  is mean-pooled and a dense head gives ``[batch, num_classes]`` in ``dtype``.

  Attributes:
    num_classes: output width.
    d_model, num_layers, num_heads, mlp_ratio: sizes (head size ``d_model /
      num_heads``, MLP width ``mlp_ratio * d_model``).
    dropout_rate: dropout after the embedding and in every residual branch,
      active only with ``train=True`` (needs the ``'dropout'`` rng).
    pre_norm: GPT-2's pre-LN block instead of the classic post-LN one.
    scan_layers: True: stack the layers with ``nn.scan`` (parameters
      ``layers/...``, leading axis ``[num_layers]``); False: unrolled
      (``layers_{i}/...``); None (default): scanned iff ``num_layers >``
      :data:`SCAN_LAYERS_ABOVE` (see :func:`scans`).
    remat: a key of :data:`purax.nn.remat.REMAT_POLICIES` (``'none'``,
      ``'full'``, ``'dots_saveable'``, ...).
    implementation: attention kernel (None: chosen for the device).
    fp8: the blocks' projections and MLP matmuls in float8
      (:mod:`purax.nn.fp8`; for H100/H200, with ``dtype`` bfloat16).
    dtype: compute dtype; param_dtype: storage dtype.

  Raises:
    ConfigError: ``d_model`` not divisible by ``num_heads``, unknown ``remat``.
  """

  num_classes: int
  d_model: int = 64
  num_layers: int = 2
  num_heads: int = 4
  mlp_ratio: int = 4
  dropout_rate: float = 0.1
  pre_norm: bool = False
  scan_layers: bool | None = None
  remat: str = 'none'
  implementation: Implementation | None = None
  fp8: bool = False
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  input_ranks = None   # any rank >= 2

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    _check(self, self.d_model, self.num_heads, self.remat)
    x = x.reshape(x.shape[0], x.shape[1], -1) if x.ndim > 2 else x[..., None]
    seq, features = x.shape[1], x.shape[2]
    kernel = param_with_names(self, 'embed', (features, self.d_model), (None, 'embed'),
                              self.param_dtype, 1.0 / math.sqrt(features))
    pos = param_with_names(self, 'pos_embedding', (seq, self.d_model), (None, 'embed'),
                           self.param_dtype)
    x = jnp.einsum('bsf,fd->bsd', x.astype(self.dtype), kernel.astype(self.dtype))
    x = x + pos.astype(self.dtype)[None]
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    kwargs = dict(num_heads=self.num_heads, mlp_ratio=self.mlp_ratio,
                  dropout_rate=self.dropout_rate, deterministic=not train,
                  pre_norm=self.pre_norm, implementation=self.implementation,
                  fp8=self.fp8, dtype=self.dtype, param_dtype=self.param_dtype)
    x = stack(kwargs, num_layers=self.num_layers, scan_layers=self.scan_layers,
              remat=self.remat, x=x)
    if self.pre_norm:
      x = layer_norm(self.dtype, self.param_dtype, 'final_norm')(x)
    pooled = jnp.mean(x, axis=1)
    head = param_with_names(self, 'head', (self.d_model, self.num_classes),
                            ('embed', 'classes'), self.param_dtype)
    bias = self.param('head_bias', nn.with_logical_partitioning(
        nn.initializers.zeros_init(), ('classes',)), (self.num_classes,), self.param_dtype)
    return pooled @ head.astype(self.dtype) + bias.astype(self.dtype)[None]


class DecoderLM(nn.Module):
  """A decoder-only (GPT-style) language model over integer tokens.

  Input int ``[batch, seq]`` tokens in ``[0, vocab_size)``; output logits
  ``[batch, seq, vocab_size]`` in ``dtype``, where position t depends only on
  tokens ``<= t`` (causal attention). Pre-LN blocks, a final LayerNorm, and
  output logits from the token embedding (tied: ``logits = x @ E^T``).
  Positions are rotary (``'rope'``, no length limit but the one of training)
  or a learned ``[max_len, d_model]`` table (``'learned'``).

  Decoding: ``decode=True`` reads and writes the ``'cache'`` collection (per
  layer keys and values, plus the number of tokens already cached,
  ``cache['index']``), laid out as the parameters are (stacked ``[layers,
  ...]`` when scanned); see :func:`purax.nn.generate.generate`.

  Attributes:
    vocab_size: number of token ids (256 for bytes).
    d_model, num_layers, num_heads, mlp_ratio: sizes.
    max_len: longest sequence with ``positions='learned'``.
    positions: ``'rope'`` or ``'learned'``.
    dropout_rate: dropout on embeddings and residual branches in training.
    scan_layers, remat, implementation, fp8, dtype, param_dtype: as in
      :class:`TransformerEncoder`.
    logits_chunk: 0 (default): the output is the logits. ``> 0``: in training
      and evaluation the output is a :class:`purax.core.losses.ChunkedLogits`
      (the final hidden states and the embedding table) and
      :func:`purax.core.objectives.language_model` computes the loss this
      many tokens at a time, never holding the ``[batch, seq, vocab]``
      logits (for when they dominate the step's temporary memory: a large
      vocabulary); decoding still returns logits.

  Raises:
    ConfigError: inconsistent sizes, unknown ``positions`` or ``remat``.
    DataError: input not ``[batch, seq]`` integers, or ``seq > max_len`` with
      learned positions.
  """

  vocab_size: int = 256
  d_model: int = 128
  num_layers: int = 4
  num_heads: int = 4
  mlp_ratio: int = 4
  max_len: int = 1024
  positions: Literal['rope', 'learned'] = 'rope'
  dropout_rate: float = 0.0
  scan_layers: bool | None = None
  remat: str = 'none'
  implementation: Implementation | None = None
  fp8: bool = False
  logits_chunk: int = 0
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  input_ranks = (2,)

  @nn.compact
  def __call__(self, tokens: jax.Array, *, train: bool = False,
               decode: bool = False) -> jax.Array:
    _check(self, self.d_model, self.num_heads, self.remat, self.positions == 'rope')
    expect(isinstance(self.logits_chunk, int) and self.logits_chunk >= 0, 'logits_chunk',
           'an integer >= 0 (tokens per chunk of the loss; 0: full logits)',
           repr(self.logits_chunk), ConfigError)
    expect(self.positions in ('rope', 'learned'), 'positions', "'rope' or 'learned'",
           repr(self.positions), ConfigError)
    expect(tokens.ndim == 2 and jnp.issubdtype(tokens.dtype, jnp.integer), 'tokens',
           'integer [batch, seq]', f'{tokens.dtype}{list(tokens.shape)}', DataError)
    batch, seq = tokens.shape
    expect(self.positions == 'rope' or seq <= self.max_len, 'tokens.shape[1] (seq)',
           f'<= max_len ({self.max_len}) with learned positions', seq, DataError)
    start = jnp.zeros((), jnp.int32)
    cache_index = None
    if decode:
      initialized = self.has_variable('cache', 'index')
      index = self.variable('cache', 'index', lambda: jnp.zeros((), jnp.int32))
      start = cache_index = index.value
      if initialized:
        index.value = start + seq
    positions = jnp.broadcast_to(start + jnp.arange(seq, dtype=jnp.int32)[None],
                                 (batch, seq))
    embed = nn.Embed(self.vocab_size, self.d_model, dtype=self.dtype,
                     param_dtype=self.param_dtype, name='embed',
                     embedding_init=nn.with_logical_partitioning(
                         nn.initializers.normal(INIT_STD), ('vocab', 'embed')))
    x = embed(tokens)
    if self.positions == 'learned':
      table = param_with_names(self, 'pos_embedding', (self.max_len, self.d_model),
                               (None, 'embed'), self.param_dtype, 0.01)
      x = x + jnp.take(table.astype(self.dtype), positions, axis=0)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    kwargs = dict(num_heads=self.num_heads, mlp_ratio=self.mlp_ratio,
                  dropout_rate=self.dropout_rate, deterministic=not train, causal=True,
                  rope=self.positions == 'rope', pre_norm=True, decode=decode,
                  implementation=self.implementation, fp8=self.fp8,
                  out_stddev=INIT_STD / math.sqrt(2 * self.num_layers),
                  dtype=self.dtype, param_dtype=self.param_dtype)
    x = stack(kwargs, num_layers=self.num_layers, scan_layers=self.scan_layers,
              remat=self.remat, x=x, positions=positions, cache_index=cache_index)
    x = layer_norm(self.dtype, self.param_dtype, 'final_norm')(x)
    if self.logits_chunk and not decode:
      return losses.ChunkedLogits(x.astype(self.dtype), embed.embedding, self.logits_chunk)
    return embed.attend(x)


def count_params(params, *, exclude=('pos_embedding',)) -> int:
  """Number of parameters, without learned position tables (they do no matmuls)."""
  total = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    if not any(getattr(k, 'key', None) in exclude for k in path):
      total += math.prod(jnp.shape(leaf))
  return total
