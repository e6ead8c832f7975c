"""The optimizer update of :meth:`purax.Task.step`: gradients (accumulated over
microbatches, loss-scaled, summed across devices), then a guarded update.

- Gradient accumulation: the batch (every leaf ``[k * m, ...]``) is split into
  ``k`` microbatches ``[m, ...]``; ``lax.scan`` (unrolled on the CPU when
  the model has convolutions, :mod:`purax.core.loops`) sums ``grad(loss_i * W_i)``,
  where ``loss_i`` is microbatch ``i``'s weighted mean loss and ``W_i`` its
  total weight, in float32, and the sum is divided by ``sum_i W_i``. That is
  exactly the gradient of the weighted mean loss of the whole batch, so
  accumulation equals one step on the concatenated batch (up to float
  summation order), also with uneven per-example weights. Clipping, the
  schedule and ``state.step`` then see one update. The dropout key of
  microbatch ``i`` is ``fold_in(fold_in(rng, step), i)``.
- Model state under accumulation (BatchNorm statistics, counters, any EMA the
  model keeps): every microbatch's forward pass starts from the step's
  ``model_state`` and the new state is the ``W_i``-weighted mean of the
  microbatches' new states, so it follows the optimizer step, not the
  microbatch: a running mean moves once per step with the whole batch's
  mean, a counter advances by one. What still differs from one big batch: a
  running *variance* is the mean of the microbatches' variances (it lacks the
  spread between microbatch means), and normalisation in the forward pass
  uses each microbatch's own statistics, as in any accumulation.
- Data parallelism (``axis_name`` inside ``pmap`` / ``shard_map``): the same
  weighted sums are ``psum``-ed across devices before the division, so the
  update is the one of the global batch.
- Loss scaling (float16): the differentiated objective is the mean loss (or,
  summing microbatches or devices, ``loss_i * W_i / n_i`` with ``n_i`` the
  number of loss values: the mean weight, a constant <= 1 for 0/1 weights)
  times ``state.guards['loss_scale']``; the gradient is divided by it right
  after, in float32. The scale applied is the state's, whatever the batch size.
- Guards (:mod:`purax.core.guards`, each a small function with its own state
  in ``state.guards`` and its own metrics; one branch for all): the
  non-finite guard skips an update whose gradients' global norm (any NaN or
  inf in any gradient makes it non-finite), loss or hyperparameters
  (:func:`purax.core.hparams.all_finite`: one written into ``opt_state``
  past the setters' checks) are not finite, counted in
  ``metrics['skipped']`` and ``metrics['skip_streak']``; the loss scale,
  if any, is halved; the spike guard (``Settings.spike_guard``, off by
  default) skips a finite update whose loss or gradient norm is a spike
  above its window (:mod:`purax.core.spikes`), counted in
  ``metrics['spikes']``; a frozen population member is skipped. A skipped
  update leaves params, optimizer state (its counters, hence the schedule,
  too) and model state bitwise as they were; ``state.step`` still advances:
  it counts steps taken (batches consumed, the data position). Its loss
  metrics (loss, accuracy, examples, ``grad_norm``) count nothing (total and
  count zeroed, never NaN): a log window's averages are those of its applied
  updates, and a window in which every update was skipped logs them as NaN
  (nothing counted).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from purax.core import guards as guards_lib
from purax.core import hparams as hparams_lib
from purax.core import loops, losses, precision
from purax.core import metrics as metrics_lib
from purax.core import optim
from purax.core.errors import ConfigError, DataError, expect
from purax.core.spikes import SpikeGuard
from purax.core.state import TrainState

#: ``loss_fn(params, model_state, batch, key, hparams) -> (loss, aux)``: the
#: weighted mean loss of a batch in training mode, float32 ``[]``, with ``aux``
#: holding ``'model_state'``, ``'metrics'``, ``'values'`` (the per-example or
#: per-token losses) and ``'weight'`` (their total weight, float32 ``[]``), as
#: :meth:`purax.Task.compute_loss` returns them.
LossFn = Callable[..., tuple[jax.Array, dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Settings:
  """How the update treats the batch, besides the loss and the optimizer.

  Attributes:
    microbatches: split each batch into this many microbatches (>= 1).
    skip_nonfinite: the non-finite guard.
    couples_examples: the loss couples examples (refused under ``axis_name``).
    spike_guard: the loss-spike guard (:mod:`purax.core.spikes`), or None.
  """

  microbatches: int = 1
  skip_nonfinite: bool = True
  couples_examples: bool = False
  spike_guard: SpikeGuard | None = None


def _split(batch, k: int):
  leaves = jax.tree.leaves(batch)
  expect(bool(leaves), 'batch', 'at least one array to split into microbatches', 'none',
         DataError)
  n = max((jnp.shape(x)[0] for x in leaves if jnp.ndim(x)), default=0)

  def split(path, a):
    where = f'batch{jax.tree_util.keystr(path)}.shape[0]'
    expect(jnp.ndim(a) >= 1, f'batch{jax.tree_util.keystr(path)}',
           f'a leading batch axis to split into microbatches={k}', 'a scalar', DataError)
    size = jnp.shape(a)[0]
    expect(size == n, where, f'{n} (the batch size of every leaf)', size, DataError)
    expect(n % k == 0, where, f'a multiple of microbatches={k}', size, DataError)
    return jnp.reshape(a, (k, n // k, *jnp.shape(a)[1:]))

  return jax.tree_util.tree_map_with_path(split, batch)


def _weighted_state_sum(model_state, weight):
  """``weight * leaf`` for floating leaves; integer leaves are carried as they are."""
  return jax.tree.map(lambda x: (jnp.where(weight > 0, x.astype(jnp.float32) * weight, 0.0)
                                 if jnp.issubdtype(x.dtype, jnp.floating) else x), model_state)


def gradients(loss_fn: LossFn, state: TrainState, batch, *, settings: Settings = Settings(),
              axis_name=None):
  """``(grads, metrics, model_state)`` of the batch's weighted mean loss.

  ``grads`` are unscaled (loss scale removed), accumulated over
  ``settings.microbatches`` and summed across ``axis_name``.

  Raises:
    ConfigError: ``axis_name`` with a loss that couples examples.
  """
  expect(not (axis_name is not None and settings.couples_examples), 'axis_name',
         'None for a loss that couples examples (a per-device loss sees only its '
         "device's examples); use jax.jit with shardings (purax.parallel.sharded), "
         'which computes it on the global batch', axis_name, ConfigError)
  key = state.step_key()
  scale = state.guards.get(guards_lib.LOSS_SCALE)
  k = settings.microbatches

  def grad_of(params, model_state, microbatch, mb_key, *, summed: bool):
    """float32-where-rescaled gradient of the mean loss, or (``summed``) of the
    weighted *sum* ``loss * W``, the loss scale removed.

    ``summed`` differentiates ``loss * W / n`` (``n`` the number of loss
    values, a constant; ``W / n`` the mean weight, <= 1 for 0/1 weights) times
    the loss scale, so the scale applied is the state's whatever the batch
    size, then multiplies by ``n``. Differentiating a weighted sum (not ``W *
    grad(mean)``) keeps the cross-device terms right when the forward pass
    couples devices (BatchNorm with ``axis_name``): every device's objective
    enters the transposed collectives with its own weight.
    """
    def objective(p):
      loss, aux = loss_fn(p, model_state, microbatch, mb_key, state.hparams)
      if summed:
        loss = loss * jax.lax.stop_gradient(aux['weight'] / aux['values'].size)
      return (loss if scale is None else scale.scale_loss(loss)), aux
    (_, aux), grads = jax.value_and_grad(objective, has_aux=True)(params)
    if not summed and scale is None:
      return grads, aux            # the plain gradient, as a hand-written step has it
    n = aux['values'].size if summed else 1
    multiplier = float(n) if scale is None else n / scale.scale
    return jax.tree.map(lambda g: g.astype(jnp.float32) * multiplier, grads), aux

  if k == 1 and axis_name is None:
    grads, aux = grad_of(state.params, state.model_state, batch, key, summed=False)
    if scale is not None:
      grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    return grads, aux['metrics'], aux['model_state']

  if k == 1:
    grads, aux = grad_of(state.params, state.model_state, batch, key, summed=True)
    weight = aux['weight']
    metrics, model_state = aux['metrics'], aux['model_state']
  else:
    micro = _split(batch, k)

    def body(carry, xs):
      grads_sum, state_sum, metrics, weight = carry
      i, microbatch = xs
      grads, aux = grad_of(state.params, state.model_state, microbatch,
                           jax.random.fold_in(key, i), summed=True)
      w = aux['weight']
      grads_sum = jax.tree.map(jnp.add, grads_sum, grads)
      new_state = _weighted_state_sum(aux['model_state'], w)
      state_sum = jax.tree.map(lambda s, x: s + x if jnp.issubdtype(s.dtype, jnp.floating)
                               else x, state_sum, new_state)
      metrics = metrics_lib.merge(metrics, aux['metrics'])
      return (grads_sum, state_sum, metrics, weight + w), None

    first = jax.tree.map(lambda a: a[0], micro)
    aux_shape = jax.eval_shape(lambda: grad_of(state.params, state.model_state, first, key,
                                               summed=True)[1])
    zero_metrics = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), aux_shape['metrics'])
    zero_state = jax.tree.map(
        lambda x: jnp.zeros(x.shape, jnp.float32 if jnp.issubdtype(x.dtype, jnp.floating)
                            else x.dtype), aux_shape['model_state'])
    zero_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, losses.float32_or_wider(p.dtype)),
                              state.params)
    (grads, state_sum, metrics, weight), _ = loops.scan(
        body, (zero_grads, zero_state, zero_metrics, jnp.zeros((), jnp.float32)),
        (jnp.arange(k), micro))
    # The weighted mean of the microbatches' new model states (see the module doc);
    # an all-padding batch (weight 0) leaves the model state as it was.
    model_state = jax.tree.map(
        lambda s, old: (jnp.where(weight > 0, s / jnp.maximum(weight, 1e-12), old)
                        .astype(old.dtype) if jnp.issubdtype(old.dtype, jnp.floating) else s),
        state_sum, state.model_state)

  if axis_name is not None:
    grads = jax.lax.psum(grads, axis_name)
    metrics = jax.lax.psum(metrics, axis_name)
    weight = jax.lax.psum(weight, axis_name)
  inv = 1.0 / jnp.maximum(weight, 1e-12)
  grads = jax.tree.map(lambda g, p: (g * inv).astype(p.dtype), grads, state.params)
  return grads, metrics, model_state


def objective(loss_fn: LossFn, state: TrainState, batch, *, settings: Settings = Settings(),
              axis_name=None) -> Callable[[Any], jax.Array]:
  """``params -> loss``: the value the step's gradients are the gradients of,
  float32 ``[]``, as a function of the params (optax's ``value_fn``, which a
  line search such as ``optax.lbfgs``'s evaluates at trial params).

  The batch's weighted mean loss in training mode, with the step's dropout
  keys and ``state.model_state`` (its update is not returned): the mean over
  the microbatches weighted by their total weights, summed across
  ``axis_name``; without either, ``loss_fn``'s loss itself.
  """
  key, k = state.step_key(), settings.microbatches

  def value(params):
    if k == 1 and axis_name is None:
      return loss_fn(params, state.model_state, batch, key, state.hparams)[0]

    def weighted(microbatch, mb_key):
      loss, aux = loss_fn(params, state.model_state, microbatch, mb_key, state.hparams)
      return jnp.stack([loss * aux['weight'], aux['weight']])

    if k == 1:
      sums = weighted(batch, key)
    else:
      micro = _split(batch, k)
      sums = jnp.sum(jax.lax.map(lambda xs: weighted(xs[1], jax.random.fold_in(key, xs[0])),
                                 (jnp.arange(k), micro)), axis=0)
    if axis_name is not None:
      sums = jax.lax.psum(sums, axis_name)
    return sums[0] / jnp.maximum(sums[1], 1e-12)

  return value


def extra_args(tx, *, value, grad, value_fn, grad_norm) -> dict[str, Any]:
  """The keyword arguments ``tx.update`` gets besides ``(updates, state, params)``.

  optax's extra-args protocol (``optax.GradientTransformationExtraArgs``):
  ``value`` (the loss), ``grad`` (the gradients) and ``value_fn``
  (:func:`objective`) go to every such transformation (``optax.chain`` hands
  them to each link, which takes what it reads:
  ``optax.contrib.reduce_on_plateau`` the value, ``optax.lbfgs``'s line
  search all three). :func:`purax.adamw` also gets ``grad_norm`` (its
  clipping's norm, computed once here). A plain ``GradientTransformation``
  gets nothing: its ``update`` takes no keyword arguments.
  """
  given = {'value': value, 'grad': grad, 'value_fn': value_fn}
  if isinstance(tx, optim.ScheduledTransformation):
    return {**given, 'grad_norm': grad_norm}
  return given if isinstance(tx, optax.GradientTransformationExtraArgs) else {}


def step(loss_fn: LossFn, tx: optax.GradientTransformation, state: TrainState, batch, *,
         settings: Settings = Settings(), axis_name=None, frozen=None):
  """One guarded optimizer update of ``tx`` on ``loss_fn``'s gradients; see the
  module docstring (optax-style: a loss function and settings in, no Task).

  The guards (:mod:`purax.core.guards`) decide together whether the update is
  applied; ``frozen`` (bool ``[]``, for populations) is one of them: a frozen
  member's params, optimizer, model state and guard state stay as they were
  (the arrays through the same ``lax.cond``: no select over the state) and
  every metric is zero. The caller keeps the ``step`` of a frozen member.
  """
  grads, metrics, model_state = gradients(loss_fn, state, batch, settings=settings,
                                          axis_name=axis_name)
  metrics = dict(metrics)
  # One pass over the gradients gives the norm the metrics report, the guards
  # test and :func:`purax.adamw`'s clipping uses (handed to it, not recomputed).
  grad_norm = optim.global_norm(grads)
  metrics['grad_norm'] = metrics_lib.Average.of(grad_norm)
  loss = metrics['loss'].total / jnp.maximum(metrics['loss'].count, 1e-12)
  extra = extra_args(tx, value=loss, grad=grads, grad_norm=grad_norm, value_fn=objective(
      loss_fn, state, batch, settings=settings, axis_name=axis_name))
  fields = ('params', 'opt_state', 'model_state')

  @precision.standard_promotion    # optax's promotions (an int32 count, bfloat16 params)
  def updated(state):
    updates, opt_state = tx.update(grads, state.opt_state, state.params, **extra)
    return optax.apply_updates(state.params, updates), opt_state, model_state

  checks = guards_lib.of(state.guards, skip_nonfinite=settings.skip_nonfinite,
                         spike_guard=settings.spike_guard, frozen_flag=frozen)
  if not checks:
    return state.replace(step=state.step + 1, **dict(zip(fields, updated(state)))), metrics
  # Any NaN or inf in any gradient makes their global norm non-finite (the
  # norm itself does not overflow: optim.global_norm rescales). A non-finite
  # hyperparameter (a NaN learning rate) spoils the update from finite
  # gradients: testing those few scalars costs nothing, where testing the
  # updates (a pass over every parameter) would have to run before the cond.
  finite = (jnp.isfinite(grad_norm) & jnp.isfinite(metrics['loss'].total)
            & hparams_lib.all_finite(state))
  verdict = guards_lib.combine(checks, guards_lib.Signals(finite, loss, grad_norm),
                               state.guards, frozen)
  # A branch taken at run time, not a select over every leaf: on the CPU a
  # select keeps the old params/opt_state alive next to the new ones, which
  # makes XLA copy the optimizer's moments before updating them in place (a
  # third of a small model's step). On a GPU it is the select (loops.branch):
  # a conditional there blocks the host until the step's work is done. The
  # skip branch returns the fields as they were.
  new = loops.branch(verdict.ok, updated, lambda s: tuple(getattr(s, f) for f in fields), state)
  # A skipped update's loss metrics count nothing (total and count zeroed: the
  # window averages its applied updates) and it counts in its guard's metric.
  metrics = jax.tree.map(lambda x: jnp.where(verdict.ok, x, jnp.zeros_like(x)), metrics)
  return (state.replace(step=state.step + 1, guards=verdict.state, **dict(zip(fields, new))),
          {**metrics, **verdict.metrics})
