"""The default optimizer: AdamW, warmup + cosine schedule, global-norm clipping,
weight decay on matrices only; and :func:`scheduled`, how purax builds it
(and the optimizers of :mod:`purax.core.optimizers`).

All hyperparameters are injected with ``optax.inject_hyperparams`` as float32
arrays in ``opt_state.hyperparams``, so a new learning rate (or a vmapped
population of them) never recompiles, and bfloat16 params never round
``b2=0.999`` to 1.0.
"""

import functools
import inspect
import math
import numbers
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from purax.core import bounds, loops
from purax.core.errors import ConfigError, expect, expect_kind
from purax.core.precision import standard_promotion


def warmup_cosine(learning_rate, *, warmup_steps: int, total_steps: int):
  """``step -> learning rate``: linear warmup from 0 to ``learning_rate`` (the
  schedule's peak), cosine decay to 0.

  Written as ``learning_rate * unit_schedule(step)`` so ``learning_rate`` may be a
  traced float32 array (optax's own builder branches on the peak in Python).
  Loshchilov & Hutter 2017, "SGDR" (cosine); Goyal et al. 2017 (warmup).
  """
  unit = standard_promotion(optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=1.0, warmup_steps=warmup_steps,
      decay_steps=max(total_steps, warmup_steps + 1), end_value=0.0))
  return lambda count: learning_rate * unit(count)


def warmup_constant(learning_rate, *, warmup_steps: int, total_steps: int = 0):
  """``step -> learning rate``: linear warmup from 0, then constant ``learning_rate`` (for
  schedule-free optimizers, which need no decay; ``total_steps`` unused)."""
  del total_steps
  unit = standard_promotion(optax.constant_schedule(1.0) if warmup_steps == 0 else
                            optax.warmup_constant_schedule(init_value=0.0, peak_value=1.0,
                                                           warmup_steps=warmup_steps))
  return lambda count: learning_rate * unit(count)


def warmup_stable_decay(learning_rate, *, warmup_steps: int, total_steps: int,
                        decay_start=None, cooldown_steps=None):
  """``step -> learning rate``: warmup-stable-decay (WSD). Linear warmup from 0
  over ``warmup_steps``, constant ``learning_rate`` (the stable phase), then
  from step ``decay_start`` a "1-sqrt" cooldown to 0 over ``cooldown_steps``
  steps, and 0 after it:

    ``rate(t) = learning_rate * min(t / warmup_steps, 1 - sqrt(p))``,
    ``p = clip((t - decay_start) / cooldown_steps, 0, 1)``

  (the warmup term is 1 when ``warmup_steps == 0``). Source: Hägele et al.
  2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
  Durations" (arXiv:2405.18392), Eq. for the 1-sqrt cooldown (their best
  cooldown shape; WSD itself from Hu et al. 2024, MiniCPM).

  ``decay_start`` and ``cooldown_steps`` (steps, float32 ``[]``, may be traced:
  :func:`scheduled` injects them as hyperparameters) default to a cooldown
  of the last 20% of ``total_steps`` (Hägele et al.'s 20%), otherwise
  ``total_steps`` is unused. Computed in float32 (steps exact below 2**24).
  """
  if cooldown_steps is None:
    cooldown_steps = max(1, round(0.2 * total_steps))
  if decay_start is None:
    decay_start = max(total_steps - cooldown_steps, 0)

  def rate(count):
    t = jnp.asarray(count, jnp.float32)
    warm = (jnp.ones((), jnp.float32) if warmup_steps == 0
            else jnp.minimum(t / jnp.float32(warmup_steps), 1.0))
    p = jnp.clip((t - decay_start) / cooldown_steps, 0.0, 1.0)
    return learning_rate * jnp.minimum(warm, 1.0 - jnp.sqrt(p))
  return rate


#: The schedules of :func:`scheduled`, by name: ``(learning_rate, *, warmup_steps,
#: total_steps, **SCHEDULE_HPARAMS[name]) -> (step -> learning rate)``.
SCHEDULES: Mapping[str, Callable] = {'cosine': warmup_cosine, 'constant': warmup_constant,
                                     'wsd': warmup_stable_decay}

#: The injected hyperparameters of a schedule of :data:`SCHEDULES` (float32
#: in ``opt_state.hyperparams`` beside the optimizer's, set by
#: :func:`purax.core.hparams.set` and varied by populations and forks).
SCHEDULE_HPARAMS: Mapping[str, tuple[str, ...]] = {'wsd': ('decay_start', 'cooldown_steps')}


def matrices(params):
  """The default weight-decay mask: True for the matrices, False for the rest.

  Decay applies to every leaf of ``ndim >= 2`` (dense and convolution kernels,
  embeddings) and not to vectors and scalars (biases, LayerNorm / BatchNorm
  scales and offsets): the convention of nanoGPT (``configure_optimizers``:
  ``p.dim() >= 2``) and MaxText, argued in lit-llama#254 and
  transformers#492 (decaying norm scales pulls them to 0, which the
  normalisation then has to undo). Under a ``'layers'`` key (parameters
  stacked by ``nn.scan``, as :func:`purax.nn.transformer.stack` stacks them,
  ``[num_layers, ...]``) the leading axis does not count: a stacked
  LayerNorm scale ``[layers, d]`` is a vector.

  Args:
    params: a params pytree (or its updates: optax calls the mask with either).

  Returns:
    A pytree of bools of ``params``' structure.

  Example: ``purax.adamw(total_steps=100, weight_decay_mask=purax.core.optim.matrices)``
  (the default); ``weight_decay_mask=None`` decays every leaf.
  """
  def decayed(path, x):
    stacked = any(getattr(k, 'key', None) == 'layers' for k in path)
    return jnp.ndim(x) - (1 if stacked else 0) >= 2
  return jax.tree_util.tree_map_with_path(decayed, params)


def check_mask(mask, field: str = 'weight_decay_mask') -> None:
  """Raises ConfigError unless ``mask`` is None, a function of the params or a
  pytree (of bools, the params' structure or a prefix of it)."""
  expect(mask is None or callable(mask) or isinstance(mask, (Mapping, tuple, list)), field,
         'None (every leaf), a function params -> pytree of bools, or such a pytree',
         f'{type(mask).__name__} {mask!r:.60}', ConfigError)


def check_finite(**values) -> None:
  """Raises ConfigError naming the first value that is not a finite real number."""
  for name, value in values.items():
    expect_kind(value, name, numbers.Real, 'a finite number')
    expect(math.isfinite(value), name, 'a finite number (a non-finite hyperparameter would '
           'turn every parameter into NaN)', value, ConfigError)


def check_steps(total_steps, warmup_steps) -> None:
  for name, value in (('total_steps', total_steps), ('warmup_steps', warmup_steps)):
    expect_kind(value, name, numbers.Integral, 'an integer')
  expect(total_steps >= 1, 'total_steps', '>= 1', total_steps, ConfigError)
  expect(0 <= warmup_steps, 'warmup_steps', '>= 0', warmup_steps, ConfigError)


def global_norm(tree) -> jax.Array:
  """The L2 norm of all leaves together, float32 ``[]``, without overflow or underflow.

  ``optax.global_norm`` squares the values: gradients of ~1e20 give ``inf``
  (the square overflows float32) and values below ~1e-23 give 0 (it
  underflows). Here the norm is right (to float32 rounding) whenever it is
  itself a finite float32; it is ``inf`` / NaN when a value is. On the CPU
  (and TPU) the values are divided by the largest magnitude and summed
  again, in a branch taken at run time only when the plain sum of squares
  overflowed or underflowed; on a GPU (where a conditional blocks the host,
  :func:`purax.core.loops.branch`) the sums of squares of the values scaled
  by ``2**-66`` and ``2**66`` are taken in the same pass as the plain one
  (three reductions of one read, which XLA fuses) and the right one chosen:
  exact to rounding unless every value is below ~``1e-36``.

  Args:
    tree: a pytree of float arrays, any float dtype (computed in float32).
  """
  leaves = [jnp.asarray(x).astype(jnp.float32) for x in jax.tree.leaves(tree)]
  if not leaves:
    return jnp.zeros((), jnp.float32)
  # The plain sum of squares is exact enough unless it overflowed or underflowed.
  plain = _sum_squares(leaves)
  usable = jnp.isfinite(plain) & (plain > 1e-30)

  def rescaled():
    biggest = jnp.max(jnp.stack([jnp.max(jnp.abs(x), initial=0.0) for x in leaves]))
    scale = jnp.where(jnp.isfinite(biggest) & (biggest > 0), biggest, 1.0)
    # A non-finite value: x / 1.0 keeps it, and the norm is inf or NaN as it should be.
    return scale * jnp.sqrt(_sum_squares(leaves, 1.0 / scale))

  def on_cpu():
    return jax.lax.cond(usable, lambda: jnp.sqrt(plain), rescaled)

  def on_gpu():
    return _one_pass_norm(leaves, plain, usable)

  return jax.lax.platform_dependent(default=on_cpu,
                                    **{p: on_gpu for p in loops.SELECT_PLATFORMS})


def _sum_squares(leaves, scale=None) -> jax.Array:
  return sum(jnp.sum(jnp.square(x if scale is None else x * scale)) for x in leaves)


def _one_pass_norm(leaves, plain, usable) -> jax.Array:
  """:func:`global_norm` without a branch: the sums of squares of the values
  scaled by ``2**-66`` (right when the plain sum overflowed: any finite norm
  fits) and ``2**66`` (when it underflowed: ``plain <= 1e-30`` bounds every
  value by 1e-15), reductions of the same read as ``plain``."""
  big = _sum_squares(leaves, 2.0 ** -66)
  small = _sum_squares(leaves, 2.0 ** 66)
  overflowed = jnp.logical_not(jnp.isfinite(plain))
  # where() inside each sqrt: the branches not chosen get no infinite derivative
  # (a meta-gradient through the norm stays finite).
  root = lambda x, chosen: jnp.sqrt(jnp.where(chosen, x, 1.0))   # noqa: E731
  return jnp.where(usable, root(plain, usable),
                   jnp.where(overflowed, 2.0 ** 66 * root(big, overflowed),
                             2.0 ** -66 * root(small, jnp.logical_not(overflowed))))


def clip_by_global_norm(max_norm, *, use_given_norm: bool = False
                         ) -> optax.GradientTransformation:
  """Rescales gradients to global L2 norm at most ``max_norm``, in float32.

  Unlike ``optax.clip_by_global_norm`` this accepts a float32 (injected)
  ``max_norm`` with bfloat16 gradients, computes the norm in float32 without
  overflow (:func:`global_norm`: gradients of 1e20 are clipped to
  ``max_norm``, not zeroed by an infinite norm), and maps zero gradients with
  ``max_norm == 0`` to zero updates rather than NaN.
  (Pascanu et al. 2013, "On the difficulty of training RNNs".)

  Args:
    max_norm: the largest global norm let through (may be a traced float32).
    use_given_norm: accept the norm as an optax extra argument,
      ``update(updates, state, params, grad_norm=global_norm(updates))``, so
      a caller that has computed it already (:func:`purax.core.update.step`,
      which needs it for its metrics and its non-finite guard) does not pay a
      second pass over the gradients. Only right where this transformation
      sees the gradients as they are (first in a chain, as in :func:`adamw`);
      without ``grad_norm`` the norm is computed here.
  """

  def clip(updates, norm):
    scale = jnp.where(norm > max_norm, max_norm / jnp.where(norm > 0, norm, 1.0), 1.0)
    return jax.tree.map(lambda g: (g.astype(jnp.float32) * scale).astype(g.dtype), updates)

  if not use_given_norm:
    return optax.GradientTransformation(
        lambda params: optax.EmptyState(),
        lambda updates, state, params=None: (clip(updates, global_norm(updates)), state))

  def update_fn(updates, state, params=None, *, grad_norm=None, **extra_args):
    del params, extra_args
    return clip(updates, global_norm(updates) if grad_norm is None else grad_norm), state

  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


def _adamw_cosine(learning_rate, weight_decay, b1, b2, eps, clip_norm, *,
                  schedule, eps_root, weight_decay_mask):
  return optax.chain(
      clip_by_global_norm(clip_norm, use_given_norm=True),
      optax.adamw(schedule(learning_rate), b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                  weight_decay=weight_decay, mu_dtype=jnp.float32, mask=weight_decay_mask),
  )


class ScheduledTransformation(NamedTuple):
  """An optax transformation (``init``, ``update``) that can also say its
  learning rate: ``learning_rate(opt_state) -> float32 []``, the rate the next
  update applies; ``learning_rate(opt_state, applied=True)``: the rate the
  last update applied (the one a log point reports; 0 before any: optax's
  schedule is read at the count before its increment, so after ``n``
  updates the last one applied ``schedule(n - 1)``).

  ``update`` takes optax extra arguments (``grad_norm=``: the gradients'
  :func:`global_norm`, computed once by the step; see
  :func:`clip_by_global_norm`)."""

  init: Callable
  update: Callable
  learning_rate: Callable[[Any], jax.Array]


def scheduled(inner: Callable, *, schedule: str = 'cosine', warmup_steps: int,
              total_steps: int, hyperparams: Mapping[str, float],
              static: Mapping[str, Any] = {}) -> ScheduledTransformation:  # noqa: B006
  """How purax's optimizers are built: ``inner`` with its hyperparameters
  injected (``optax.inject_hyperparams``, float32) and a learning-rate schedule.

  The learning rate has one name from the command line to the log:
  ``learning_rate`` is the ``--learning-rate`` flag, the config field, the
  builders' argument, the hyperparameter in ``opt_state.hyperparams`` (read
  and set by :func:`purax.core.hparams.get` / ``set``, swept and perturbed by
  populations and PBT) and ``train/learning_rate`` in the log. What the state
  stores is the schedule's *peak*; the rate an update applies is
  ``learning_rate * schedule(count)`` (what the log reports and
  ``learning_rate(opt_state)`` below gives). Checkpoints written before 0.3
  call it ``peak_learning_rate``; they restore under the new name.

  Args:
    inner: ``(learning_rate, ..., *, schedule, **static) -> optax
      transformation``, a function with a named argument per
      hyperparameter (``inject_hyperparams`` reads its signature);
      ``schedule(learning_rate)`` is the ``step -> learning rate`` function to use.
    schedule: a key of :data:`SCHEDULES` (``'cosine'``: warmup then cosine
      decay to 0 at ``total_steps``; ``'constant'``: warmup then constant;
      ``'wsd'``: warmup, constant, a 1-sqrt cooldown to 0,
      :func:`warmup_stable_decay`). A schedule of :data:`SCHEDULE_HPARAMS`
      has its own injected hyperparameters (``'wsd'``: ``decay_start``,
      ``cooldown_steps``), which ``hyperparams`` must give: ``inner`` is
      wrapped to take them, and ``schedule(learning_rate)`` inside it reads them.
    warmup_steps, total_steps: the schedule's lengths (static).
    hyperparams: ``name -> value`` of every injected hyperparameter, with
      ``learning_rate``: float32 ``[]`` leaves of ``opt_state.hyperparams``.
    static: the other arguments of ``inner`` (a weight-decay mask, flags).

  Returns:
    A :class:`ScheduledTransformation`; ``learning_rate(opt_state)`` is
    ``learning_rate * schedule(count)`` (``applied=True``: at ``count - 1``). The same arguments (when
    hashable) give the same object: a Task rebuilt with the same values is
    equal to the first and its jitted step is not compiled again.
  """
  key = (inner, schedule, int(warmup_steps), int(total_steps),
         tuple(sorted((k, float(v)) for k, v in hyperparams.items())),
         tuple(sorted(static.items())))
  try:
    hash(key)
  except TypeError:   # an unhashable static argument (a mask pytree): built anew
    return _scheduled.__wrapped__(*key)
  return _scheduled(*key)


# One transformation per set of values (see ``scheduled``). Other values give
# another transformation (another compilation); to try learning rates without
# recompiling, keep one Task and set them in the state (purax.set_hyperparams, or a
# population).
@functools.lru_cache(maxsize=256)
def _scheduled(inner, schedule, warmup_steps, total_steps, hyperparams, static):
  expect(schedule in SCHEDULES, 'schedule', f'one of {sorted(SCHEDULES)}', repr(schedule),
         ConfigError)
  extra = SCHEDULE_HPARAMS.get(schedule, ())
  missing = [name for name in extra if name not in dict(hyperparams)]
  expect(not missing, 'hyperparams', f'{list(extra)} with schedule {schedule!r} (its '
         'injected hyperparameters)', f'none for {missing}', ConfigError)
  shape = functools.partial(SCHEDULES[schedule], warmup_steps=warmup_steps,
                            total_steps=total_steps)
  unit = shape(1.0)
  curve = lambda rate: (lambda count: rate * unit(count))   # noqa: E731
  if extra:   # the schedule's own hyperparameters: arguments of the inner, injected
    inner = _with_schedule_hparams(inner, extra)
    curve = lambda rate, **values: shape(rate, **values)     # noqa: E731
  static = dict(static)
  factory = optax.inject_hyperparams(inner, static_args=('schedule', *static),
                                     hyperparam_dtype=jnp.float32)
  tx = factory(**dict(hyperparams), schedule=curve, **static)

  def current(opt_state, *, applied: bool = False):
    # The schedule's count is the updates applied (a skipped update leaves it).
    count = jnp.maximum(opt_state.count - 1, 0) if applied else opt_state.count
    if extra:
      values = {name: opt_state.hyperparams[name] for name in extra}
      rate = shape(opt_state.hyperparams['learning_rate'], **values)(count)
    else:
      rate = opt_state.hyperparams['learning_rate'] * unit(count)
    if applied:
      rate = jnp.where(opt_state.count > 0, rate, 0.0)
    return rate.astype(jnp.float32)

  return ScheduledTransformation(tx.init, standard_promotion(tx.update), current)


@functools.lru_cache(maxsize=64)
def _with_schedule_hparams(inner, names: tuple[str, ...]):
  """``inner`` taking ``names`` (a schedule's hyperparameters) as keyword
  arguments too, so ``optax.inject_hyperparams`` (which injects only the
  arguments of the function it wraps) injects them; they reach the schedule:
  ``schedule(learning_rate)`` inside ``inner`` is ``schedule(learning_rate,
  **those values)``. One wrapper per ``inner`` (a Task rebuilt is equal)."""
  signature = inspect.signature(inner)

  def wrapped(*args, schedule, **kwargs):
    values = {name: kwargs.pop(name) for name in names}
    return inner(*args, schedule=lambda rate: schedule(rate, **values), **kwargs)

  parameters = list(signature.parameters.values())
  parameters += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in names]
  wrapped.__signature__ = signature.replace(parameters=parameters)
  wrapped.__name__ = getattr(inner, '__name__', 'inner')
  return wrapped


def adamw(*, learning_rate: float = 1e-3, total_steps: int, warmup_steps: int = 0,
          weight_decay: float = 1e-4, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, clip_norm: float = 1.0,
          eps_root: float = 0.0, weight_decay_mask=matrices, schedule: str = 'cosine',
          decay_start: float | None = None,
          cooldown_steps: float | None = None) -> ScheduledTransformation:
  """AdamW (Loshchilov & Hutter 2019) with a warmup-cosine (or WSD) schedule and clipping.

  Args:
    learning_rate: the schedule's peak, reached after ``warmup_steps``
      (:func:`scheduled`), in :data:`purax.core.bounds.BOUNDS`' ``(0, 10]``.
    total_steps: optimizer updates over which the cosine decays to 0 (static).
    warmup_steps: linear warmup length (static).
    weight_decay: decoupled weight decay coefficient.
    b1, b2, eps: Adam's moment decay rates and denominator epsilon.
    clip_norm: gradients are rescaled to at most this global L2 norm (> 0,
      finite: a state's hyperparameters are; no clipping: a large value,
      e.g. ``1e30``).
    eps_root: added to the second moment inside the square root,
      ``sqrt(nu + eps_root)`` (static; optax's ``eps_root``). 0 is Adam as
      published; differentiating *through* training (``jax.grad`` of a loss
      after some steps with respect to a hyperparameter: a meta-gradient)
      needs it > 0 (e.g. 1e-8), since ``d sqrt(nu) / d nu`` is infinite at
      ``nu = 0`` and the gradient comes out NaN.
    weight_decay_mask: which leaves are decayed (static; optax's ``mask``):
      default :func:`matrices`, every leaf of ``ndim >= 2`` and no bias or
      norm scale (nanoGPT's and MaxText's convention; lit-llama#254,
      transformers#492); ``None``: every leaf (purax before 0.2, and
      ``optax.adamw``'s default); or a function ``params -> pytree of bools``,
      or such a pytree.
    schedule: ``'cosine'`` (the default) or ``'wsd'``: warmup, constant
      ``learning_rate``, then a 1-sqrt cooldown to 0
      (:func:`warmup_stable_decay`; Hägele et al. 2024).
    decay_start, cooldown_steps: ``'wsd'`` only (steps, float; injected, so
      a population or :func:`purax.fork` may vary them): where the cooldown
      starts and how many steps it spans; default the last 20% of
      ``total_steps``. ``decay_start`` in ``[0, inf)``, ``cooldown_steps`` in
      ``(0, inf)`` (:data:`purax.core.bounds.BOUNDS`).

  Returns:
    An optax transformation whose state holds the six float hyperparameters
    (eight with ``'wsd'``)
    as float32 ``[]`` arrays in ``opt_state.hyperparams``; its
    ``learning_rate(opt_state)`` is the rate the next update applies
    (``applied=True``: the last update's; :class:`ScheduledTransformation`).

  Raises:
    ConfigError: a value outside its interval of :data:`purax.core.bounds.BOUNDS`
      or not finite (NaN, ``inf``), naming the field
      (:func:`purax.core.bounds.check`); a mask that is neither None, a
      function nor a pytree.
  """
  bounds.check(learning_rate=learning_rate, weight_decay=weight_decay, b1=b1, b2=b2, eps=eps,
               clip_norm=clip_norm)
  check_finite(eps_root=eps_root)
  check_steps(total_steps, warmup_steps)
  check_mask(weight_decay_mask)
  expect(eps_root >= 0, 'eps_root', '>= 0', eps_root, ConfigError)
  expect(eps > 0 or eps_root > 0, 'eps', '> 0 (or eps_root > 0: with both 0 a gradient entry '
         'that is 0 from the start divides 0 by 0)', eps, ConfigError)
  bounds.check(**{name: value for name, value in (('decay_start', decay_start),
                                                   ('cooldown_steps', cooldown_steps))
                  if value is not None})
  expect(schedule in ('cosine', 'wsd'), 'schedule', "'cosine' or 'wsd'", repr(schedule),
         ConfigError)
  expect(schedule == 'wsd' or (decay_start is None and cooldown_steps is None),
         'decay_start, cooldown_steps', "unset unless schedule='wsd'",
         f'{decay_start}, {cooldown_steps} with schedule {schedule!r}', ConfigError)
  extra = {}
  if schedule == 'wsd':
    cooldown = max(1, round(0.2 * total_steps)) if cooldown_steps is None else cooldown_steps
    start = max(total_steps - cooldown, 0) if decay_start is None else decay_start
    bounds.check(decay_start=start, cooldown_steps=cooldown)
    extra = dict(decay_start=float(start), cooldown_steps=float(cooldown))
  return scheduled(_adamw_cosine, schedule=schedule, warmup_steps=warmup_steps,
                   total_steps=total_steps,
                   hyperparams=dict(learning_rate=learning_rate,
                                    weight_decay=weight_decay, b1=b1, b2=b2, eps=eps,
                                    clip_norm=clip_norm, **extra),
                   static=dict(eps_root=float(eps_root), weight_decay_mask=weight_decay_mask))
