"""The optimizer update of :meth:`purax.Task.step`: gradients (accumulated over
microbatches, loss-scaled, summed across devices), then a guarded update.

- Gradient accumulation: the batch ``[k * m, ...]`` is split into ``k``
  microbatches ``[m, ...]`` and ``lax.scan`` sums ``grad(loss_i * W_i)``, where
  ``W_i`` is microbatch ``i``'s total example weight; the sum is divided by
  ``sum_i W_i``. That is exactly the gradient of the weighted mean loss of the
  whole batch, so accumulation equals one step on the concatenated batch (up to
  float summation order), also with uneven per-example weights. Clipping, the
  schedule and ``state.step`` then see one update. BatchNorm statistics are
  threaded through the microbatches in order. The dropout key of microbatch
  ``i`` is ``fold_in(fold_in(rng, step), i)``.
- Data parallelism (``axis_name`` inside ``pmap`` / ``shard_map``): the same
  sums are ``psum``-ed across devices before the division, so the update is
  the one of the global batch.
- Loss scaling (float16): the objective is multiplied by ``state.loss_scale``
  before differentiation and the gradients divided after, in float32.
- Non-finite guard: when any gradient (or the loss) is not finite, the update
  is skipped — params, optimizer state (its counters, hence the schedule,
  too) and model state stay bitwise as they were — and the step counts in
  ``metrics['skipped']``; its loss metrics are zeroed so the window's averages
  stay finite. ``state.step`` still advances: it counts steps taken (batches
  consumed, the data position), so the next step reads the next batch with a
  new dropout key, and a run of N steps ends at ``step == N`` with skips or
  without. The loss scale, if any, is still halved.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from purax.core import metrics as metrics_lib
from purax.core.errors import DataError, expect


def _split(batch, k: int):
  n = jnp.shape(batch['x'])[0]
  expect(n % k == 0, "batch['x'].shape[0]", f'a multiple of microbatches={k}', n, DataError)
  return jax.tree.map(lambda a: jnp.reshape(a, (k, n // k, *jnp.shape(a)[1:])), batch)


def gradients(task, state, batch, *, axis_name=None):
  """``(grads, metrics, model_state)`` of the batch's weighted mean loss.

  ``grads`` are unscaled (loss scale removed) and summed across ``axis_name``.
  """
  key = state.step_key()
  scale = state.loss_scale
  k = task.microbatches

  if k == 1 and axis_name is None and scale is None:
    # The plain path: the gradient of the weighted mean loss itself.
    (_, aux), grads = jax.value_and_grad(task.loss, has_aux=True)(
        state.params, state.model_state, batch, key, hparams=state.hparams, train=True)
    return grads, aux['metrics'], aux['model_state']

  def weighted_grad(params, model_state, microbatch, mb_key):
    def objective(p):
      loss, aux = task.loss(p, model_state, microbatch, mb_key, hparams=state.hparams,
                            train=True)
      total = loss * aux['weight']           # the weighted sum of per-example losses
      if scale is not None:
        total = scale.scale_loss(total)
      return total, aux
    (_, aux), grads = jax.value_and_grad(objective, has_aux=True)(params)
    return grads, aux

  if k == 1:
    grads, aux = weighted_grad(state.params, state.model_state, batch, key)
    metrics, model_state = aux['metrics'], aux['model_state']
    weight = aux['weight']
  else:
    micro = _split(batch, k)
    first = jax.tree.map(lambda a: a[0], micro)
    aux_shape = jax.eval_shape(lambda: weighted_grad(state.params, state.model_state, first,
                                                     key)[1])
    zero_metrics = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), aux_shape['metrics'])

    def body(carry, xs):
      grads_sum, model_state, metrics, weight = carry
      i, microbatch = xs
      grads, aux = weighted_grad(state.params, model_state, microbatch,
                                 jax.random.fold_in(key, i))
      grads_sum = jax.tree.map(jnp.add, grads_sum, grads)
      metrics = metrics_lib.merge(metrics, aux['metrics'])
      return (grads_sum, aux['model_state'], metrics, weight + aux['weight']), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    (grads, model_state, metrics, weight), _ = jax.lax.scan(
        body, (zeros, state.model_state, zero_metrics, jnp.zeros((), jnp.float32)),
        (jnp.arange(k), micro))

  if axis_name is not None:
    grads = jax.lax.psum(grads, axis_name)
    metrics = jax.lax.psum(metrics, axis_name)
    weight = jax.lax.psum(weight, axis_name)
  inv = 1.0 / jnp.maximum(weight, 1e-12)
  if scale is not None:
    inv = inv / scale.scale
  grads = jax.tree.map(lambda g: (g.astype(jnp.float32) * inv).astype(g.dtype), grads)
  return grads, metrics, model_state


def step(task, state, batch, *, axis_name=None):
  """One guarded optimizer update; see the module docstring."""
  grads, metrics, model_state = gradients(task, state, batch, axis_name=axis_name)
  metrics = dict(metrics)
  grad_norm = optax.global_norm(grads)
  metrics['grad_norm'] = metrics_lib.Average.of(grad_norm)

  def apply(state):
    updates, opt_state = task.tx.update(grads, state.opt_state, state.params)
    return state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                         model_state=model_state, opt_state=opt_state)

  guard = task.skip_nonfinite or state.loss_scale is not None
  if not guard:
    return apply(state), metrics
  # Any NaN or inf in the gradients makes their global norm non-finite (so does a
  # finite norm above ~1.8e19, which overflows float32: skipping that is right too).
  finite = jnp.logical_and(jnp.isfinite(grad_norm), jnp.isfinite(metrics['loss'].total))
  # An elementwise select that XLA fuses into the update's own loops (no extra
  # pass over the state); every field stays bitwise as it was when not finite.
  updated = apply(state)
  keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
  new_state = state.replace(step=updated.step,
                            **{f: keep(getattr(updated, f), getattr(state, f))
                               for f in ('params', 'opt_state', 'model_state')})
  metrics = jax.tree.map(lambda x: jnp.where(finite, x, jnp.zeros_like(x)), metrics)
  metrics['skipped'] = metrics_lib.Sum.of(jnp.logical_not(finite))
  metrics['skip_streak'] = metrics_lib.Streak.of(jnp.logical_not(finite))
  if state.loss_scale is not None:
    new_state = new_state.replace(loss_scale=state.loss_scale.update(finite))
    metrics['loss_scale'] = metrics_lib.Average.of(state.loss_scale.scale)
  return new_state, metrics
