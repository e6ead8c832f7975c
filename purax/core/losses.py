"""Per-example losses, computed in (at least) float32 whatever the compute dtype.

Both return ``[batch]`` arrays; callers reduce them with per-example weights so
that padded examples (weight 0) never count.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import struct


def float32_or_wider(dtype) -> jnp.dtype:
  """float32, or ``dtype`` if it is a wider float (float64 under x64, for
  gradient checks): the dtype losses and statistics are computed in. Written
  out, not ``jnp.promote_types``, which has no path from bfloat16 or float8 to
  float32 under ``jax_numpy_dtype_promotion='strict'``."""
  wider = jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits > 32
  return jnp.dtype(dtype) if wider else jnp.dtype(jnp.float32)


def at_least_float32(x: jax.Array) -> jax.Array:
  """``x`` cast to float32, or kept if wider (:func:`float32_or_wider`)."""
  return x.astype(float32_or_wider(x.dtype))


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array,
                          label_smoothing: jax.Array | float = 0.0) -> jax.Array:
  """Softmax cross-entropy with integer labels and optional label smoothing.

  Args:
    logits: ``[batch, num_classes]``, any float dtype (cast to float32).
    labels: ``[batch]`` integers in ``[0, num_classes)``.
    label_smoothing: float32 ``[]`` in ``[0, 1)``; the target is
      ``(1 - s) * one_hot + s / num_classes`` (Szegedy et al. 2016,
      "Rethinking the Inception Architecture", sec. 7). May be a traced array.

  Returns:
    ``[batch]`` float32 losses.
  """
  logits = at_least_float32(logits)
  num_classes = logits.shape[-1]
  targets = jax.nn.one_hot(labels, num_classes, dtype=logits.dtype)
  s = jnp.asarray(label_smoothing, logits.dtype)
  targets = (1.0 - s) * targets + s / num_classes
  return optax.softmax_cross_entropy(logits, targets)


def mean_squared_error(predictions: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean squared error over all but the batch axis.

  Args:
    predictions: ``[batch, ...]``, any float dtype (cast to float32).
    targets: ``[batch, ...]`` of the same shape.

  Returns:
    ``[batch]`` float32 losses.
  """
  err = at_least_float32(predictions) - at_least_float32(targets)
  return jnp.mean(jnp.square(err).reshape(err.shape[0], -1), axis=-1)


def top1_correct(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """float32 0/1 ``[...]``: ``argmax(logits, -1) == labels`` (the first largest
  logit on a tie, as ``jnp.argmax``), without an argmax pass.

  The label's logit is compared with the row's max (the reduction the
  softmax computes too, so XLA shares it) and a tie is broken by counting the
  maxima before the label: both are plain reductions, where an argmax is a
  variadic (value, index) reduction that the CPU backend does not fuse. A
  row with a NaN logit counts as not correct.

  Args:
    logits: ``[..., classes]``, any float dtype.
    labels: ``[...]`` integers in ``[0, classes)``.
  """
  labels = labels.astype(jnp.int32)
  top = jnp.max(logits, axis=-1, keepdims=True)
  picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)
  at_top = logits == top
  before = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) < labels[..., None]
  earlier = jnp.sum(at_top & before, axis=-1)
  return jax.lax.stop_gradient((picked[..., 0] == top[..., 0]) & (earlier == 0)).astype(
      jnp.float32)


def token_cross_entropy(logits: jax.Array, labels: jax.Array,
                        label_smoothing: jax.Array | float = 0.0) -> jax.Array:
  """Per-token softmax cross-entropy for language models, in float32.

  Equal to :func:`softmax_cross_entropy` on every token, but without a
  ``[..., vocab]`` one-hot: with ``lse = logsumexp(z)`` the smoothed loss is
  ``(1 - s) * (lse - z[label]) + s * (lse - mean(z))``.

  Args:
    logits: ``[batch, seq, vocab]``, any float dtype (cast to float32).
    labels: ``[batch, seq]`` integers in ``[0, vocab)``.
    label_smoothing: float32 ``[]`` in ``[0, 1)``; may be traced.

  Returns:
    ``[batch, seq]`` float32 losses (nats per token).
  """
  return token_cross_entropy_and_nll(logits, labels, label_smoothing)[0]


def token_cross_entropy_and_nll(logits: jax.Array, labels: jax.Array,
                                label_smoothing: jax.Array | float = 0.0):
  """``(loss, nll)``: :func:`token_cross_entropy` and the plain negative
  log-likelihood ``lse - z[label]`` (no smoothing: what bits per byte and
  perplexity measure), both float32 ``[batch, seq]``; see :func:`token_losses`."""
  loss, nll, _ = token_losses(logits, labels, label_smoothing)
  return loss, nll


def token_losses(logits: jax.Array, labels: jax.Array,
                 label_smoothing: jax.Array | float = 0.0, *, log_z: bool = False):
  """``(loss, nll, correct)`` per token, float32 ``labels.shape`` each
  (``log_z``: and the log of the softmax normalizer, ``logsumexp(logits)``,
  for the z-loss; its gradient is the softmax's).

  ``loss`` is :func:`token_cross_entropy`, ``nll`` the plain ``lse - z[label]``
  (no smoothing: what bits per byte and perplexity measure), ``correct``
  (0/1, no gradient) whether the label's logit is the largest: read off the
  max-shifted logits the loss needs anyway (the label's shifted logit is 0),
  so there is no argmax pass over ``[..., vocab]``; a tie for the largest
  counts as correct.

  The gradient is a custom VJP: one elementwise expression over ``[...,
  vocab]`` (``_token_terms_bwd``) in which label smoothing is a per-token
  coefficient, so at ``s = 0`` (traced, not a branch) the backward pass
  produces the ``[..., vocab]`` values of plain cross-entropy and no more;
  the gradients equal autodiff's of the same formula to float32 rounding
  (``tests/core/test_losses.py``), with respect to ``label_smoothing`` too.
  Reverse mode only: ``jax.jvp`` through it raises (as through any
  ``jax.custom_vjp``).

  Args:
    logits: ``[..., vocab]``, any float dtype (computed in float32).
    labels: ``[...]`` integers in ``[0, vocab)``.
    label_smoothing: float32 ``[]`` in ``[0, 1)``; may be traced.
  """
  logits = at_least_float32(logits)
  s = jnp.asarray(label_smoothing, logits.dtype)
  loss, nll, correct, lse = _token_terms(logits, labels.astype(jnp.int32), s)
  if log_z:
    return loss, nll, correct, lse
  return loss, nll, correct


def _token_terms_fwd(logits, labels, s):
  """``(loss, nll, correct, log_z)`` and the backward pass's residuals."""
  # Shifted by the max (a constant of the gradient): lse - z[label] then
  # cancels no large offset, and exp neither overflows nor underflows to an
  # all-zero sum: the log-sum-exp without jax.nn.logsumexp's second max pass.
  top = jnp.max(logits, axis=-1, keepdims=True)
  shifted = logits - top
  exp = jnp.exp(shifted)
  total = jnp.sum(exp, axis=-1)
  lse = jnp.log(total)
  picked = jnp.take_along_axis(shifted, labels[..., None], axis=-1)[..., 0]
  nll = lse - picked
  # The smoothing term's mean: one more reduction over the vocabulary, a
  # sibling of the sum of exponentials (s is traced: populations sweep it).
  smooth = lse - jnp.mean(shifted, axis=-1)
  loss = (1.0 - s) * nll + s * smooth
  correct = (picked >= 0).astype(jnp.float32)       # the label's logit is the max
  # Saved: exp(z - max), which the autodiff of this formula saves too, and
  # per-token values; no other [..., vocab] value.
  return (loss, nll, correct, lse + top[..., 0]), (exp, total, labels, s, smooth - nll)


def _token_terms_bwd(residuals, cotangents):
  """The gradient in one elementwise expression over ``[..., vocab]``:
  ``dz = c1 * exp(z - max) - c3``, then ``- c2`` at the label (one scatter
  onto ``dz``), with per-token ``c1 = (g_loss + g_nll + g_log_z) / sum(exp)``,
  ``c2 = (1 - s) * g_loss + g_nll`` and ``c3 = s * g_loss / vocab``: the
  softmax gradient ``softmax - (1 - s) * one_hot - s / vocab`` of the loss
  plus those of ``nll`` and ``log_z``. The smoothing term is the ``c3``
  subtraction, the operand that the scatter of a one-hot gradient would
  otherwise get as zeros: at ``s = 0`` the step produces no ``[..., vocab]``
  value that plain cross-entropy (optax's, autodiff) does not."""
  exp, total, labels, s, d_smoothing = residuals
  g_loss, g_nll, _, g_log_z = cotangents        # `correct` is a step function
  vocab = exp.shape[-1]
  c1 = (g_loss + g_nll + g_log_z) / total
  c2 = (1.0 - s) * g_loss + g_nll
  c3 = s * g_loss / vocab
  dz = exp * c1[..., None] - c3[..., None]
  dz = _add_at(dz, labels, -c2)
  return dz, None, jnp.sum(g_loss * d_smoothing).astype(s.dtype)


@jax.custom_vjp
def _token_terms(logits, labels, s):
  return _token_terms_fwd(logits, labels, s)[0]


_token_terms.defvjp(_token_terms_fwd, _token_terms_bwd)


def _add_at(x: jax.Array, labels: jax.Array, values: jax.Array) -> jax.Array:
  """``x[..., labels] += values`` (``x`` ``[..., vocab]``, ``labels`` and
  ``values`` ``[...]``): one scatter onto ``x``, as the transpose of
  ``take_along_axis`` is, without its zeros."""
  batch = tuple(range(labels.ndim))
  numbers = jax.lax.ScatterDimensionNumbers(
      update_window_dims=(), inserted_window_dims=(labels.ndim,),
      scatter_dims_to_operand_dims=(labels.ndim,), operand_batching_dims=batch,
      scatter_indices_batching_dims=batch)
  return jax.lax.scatter_add(x, labels[..., None], values, numbers,
                             mode=jax.lax.GatherScatterMode.FILL_OR_DROP)


class ChunkedLogits(struct.PyTreeNode):
  """Next-token logits not yet computed: ``logits = hidden @ embedding.T``,
  which :func:`chunked_token_losses` computes ``chunk`` tokens at a time, so
  the ``[batch, seq, vocab]`` logits (float32 in the loss: 3.1 GiB at GPT-2
  small's batch 16 x 1024 tokens x 50,304) never exist at once.

  What :class:`purax.nn.transformer.DecoderLM` returns with ``logits_chunk >
  0`` (training and evaluation; decoding returns logits), and what
  :func:`purax.core.objectives.language_model` takes in place of logits.

  Attributes:
    hidden: ``[batch, seq, d]`` final hidden states, in the compute dtype.
    embedding: ``[vocab, d]`` output projection (the tied embedding table), in
      its storage dtype; cast to ``hidden.dtype`` for the matmul (as
      ``flax.linen.Embed.attend`` does), so its gradient accumulates across
      chunks in the storage dtype.
    chunk: tokens per chunk (static).
  """

  hidden: jax.Array
  embedding: jax.Array
  chunk: int = struct.field(pytree_node=False, default=1024)

  @property
  def shape(self) -> tuple[int, int, int]:
    """``(batch, seq, vocab)``: the shape of the logits."""
    return (*self.hidden.shape[:2], self.embedding.shape[0])

  @property
  def ndim(self) -> int:
    return 3

  @property
  def dtype(self):
    return self.hidden.dtype

  def logits(self) -> jax.Array:
    """The full logits ``[batch, seq, vocab]`` in ``hidden.dtype`` (for
    inspection; the loss never builds them)."""
    return jnp.einsum('bsd,vd->bsv', self.hidden, self.embedding.astype(self.hidden.dtype))


def chunked_token_losses(logits: ChunkedLogits, labels: jax.Array,
                         label_smoothing: jax.Array | float = 0.0):
  """:func:`token_losses` of ``logits.logits()``, a chunk of tokens at a time.

  The ``batch * seq`` tokens are split into chunks of ``logits.chunk`` (the
  last one padded) and scanned; each chunk's logits ``[chunk, vocab]`` are
  computed, reduced to its per-token values and dropped, and recomputed in
  the backward pass (``jax.checkpoint``), so the temporary memory of the
  loss is that of one chunk, not of ``[batch, seq, vocab]``. The values
  equal :func:`token_losses` of the full logits to float rounding (the same
  per-token arithmetic; the embedding's gradient is summed chunk by chunk).
  Compute: each chunk's logits are computed again in the backward pass,
  ``2 x tokens x d x vocab`` more FLOPs (against the step's ~``6 x params x
  tokens``: ~10% more at GPT-2 small, whose embedding is 39M of its 124M
  parameters; ~3% at 1.3B).

  Args:
    logits: the hidden states and output projection (:class:`ChunkedLogits`).
    labels: ``[batch, seq]`` integers in ``[0, vocab)``.
    label_smoothing: float32 ``[]`` in ``[0, 1)``; may be traced.

  Returns:
    ``(loss, nll, correct)``, each float32 ``[batch, seq]``, as :func:`token_losses`.

  Example:
    >>> import numpy as np
    >>> from purax.core import losses
    >>> rng = np.random.default_rng(0)
    >>> out = losses.ChunkedLogits(rng.normal(size=(2, 5, 4)).astype(np.float32),
    ...                            rng.normal(size=(7, 4)).astype(np.float32), chunk=3)
    >>> labels = rng.integers(0, 7, (2, 5))
    >>> chunked = losses.chunked_token_losses(out, labels)[0]
    >>> bool(np.allclose(chunked, losses.token_losses(out.logits(), labels)[0], rtol=1e-6))
    True
  """
  hidden, embedding = logits.hidden, logits.embedding
  batch, seq, d = hidden.shape
  n = batch * seq
  chunk = max(1, min(int(logits.chunk), n))
  count = -(-n // chunk)
  pad = count * chunk - n
  flat = jnp.pad(hidden.reshape(n, d), ((0, pad), (0, 0))).reshape(count, chunk, d)
  ids = jnp.pad(labels.reshape(n), (0, pad)).reshape(count, chunk)

  @jax.checkpoint
  def one(h, y, table, s):
    z = jnp.einsum('cd,vd->cv', h, table.astype(h.dtype))
    return token_losses(z, y, s)

  def body(carry, xs):
    return carry, one(*xs, embedding, label_smoothing)

  _, values = jax.lax.scan(body, None, (flat, ids))
  return tuple(v.reshape(count * chunk)[:n].reshape(batch, seq) for v in values)
