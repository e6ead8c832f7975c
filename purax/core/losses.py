"""Per-example losses, computed in (at least) float32 whatever the compute dtype.

Both return ``[batch]`` arrays; callers reduce them with per-example weights so
that padded examples (weight 0) never count.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def at_least_float32(x: jax.Array) -> jax.Array:
  """``x`` cast to float32, or kept if wider (float64 under x64, for gradient checks)."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


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
                 label_smoothing: jax.Array | float = 0.0):
  """``(loss, nll, correct)`` per token from two passes over ``[..., vocab]``.

  The forward pass reads the logits twice (the max; then the sum of
  exponentials with, in the same loop, the sum that label smoothing needs),
  gathers the label's logit, and says ``correct`` = the label's logit is the
  largest (no argmax pass; a tie for the largest counts as correct). The backward pass is one elementwise pass,
  ``dz = g * (softmax(z) - (1 - s) * one_hot(label) - s / vocab)`` (plus
  ``g_nll * (softmax(z) - one_hot(label))``), computed from the saved logits
  and ``lse`` without a one-hot array. With ``s = 0`` the smoothing term adds
  exactly 0, so the loss is bitwise ``nll``; ``s`` may be traced (a
  population sweeps it), so there is no branch on it.

  Args:
    logits: ``[..., vocab]``, any float dtype (computed in float32).
    labels: ``[...]`` integers in ``[0, vocab)``.
    label_smoothing: float32 ``[]`` in ``[0, 1)``. Not differentiated.

  Returns:
    ``loss`` (smoothed cross-entropy), ``nll`` (``lse - z[label]``) and
    ``correct`` (float32 0/1), each float32 ``labels.shape``. ``correct`` has
    no gradient (a step function).
  """
  return _token_losses(logits, labels.astype(jnp.int32),
                       jnp.asarray(label_smoothing, jnp.float32))


def _token_forward(logits, labels, s):
  z = at_least_float32(logits)
  vocab = z.shape[-1]
  # Relative to the max, so that lse - z[label] cancels no large offset (logits
  # of ~1e4 have a float32 spacing of ~1e-3): the second pass reads z - top
  # for both sums (sibling reductions of one loop).
  top = jax.lax.stop_gradient(jnp.max(z, axis=-1))
  shifted = z - top[..., None]
  lse = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
  mean = jnp.sum(shifted, axis=-1) / vocab
  picked = jnp.take_along_axis(shifted, labels[..., None], axis=-1)[..., 0]
  nll = lse - picked
  s = s.astype(z.dtype)
  loss = nll + s * (picked - mean)        # (1 - s) * nll + s * (lse - mean)
  correct = (picked >= 0).astype(jnp.float32)   # the label's logit is the max
  return (loss, nll, correct), (top, lse)


@jax.custom_vjp
def _token_losses(logits, labels, s):
  return _token_forward(logits, labels, s)[0]


def _token_losses_fwd(logits, labels, s):
  out, (top, lse) = _token_forward(logits, labels, s)
  return out, (logits, labels, s, top, lse)


def _token_losses_bwd(residuals, cotangents):
  logits, labels, s, top, lse = residuals
  g_loss, g_nll, _ = cotangents          # `correct` is a step function: no gradient
  z = at_least_float32(logits)
  vocab = z.shape[-1]
  s = s.astype(z.dtype)
  g = (g_loss + g_nll)[..., None]
  p = jnp.exp((z - top[..., None]) - lse[..., None])
  hot = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1) == labels[..., None]
  on_label = (g_loss * (1.0 - s) + g_nll)[..., None]
  dz = g * p - jnp.where(hot, on_label, 0.0) - (g_loss * s / vocab)[..., None]
  return dz.astype(logits.dtype), None, None


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)
