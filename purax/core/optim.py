"""The default optimizer: AdamW, warmup + cosine schedule, global-norm clipping.

All hyperparameters are injected with ``optax.inject_hyperparams`` as float32
arrays in ``opt_state.hyperparams``, so a new learning rate (or a vmapped
population of them) never recompiles, and bfloat16 params never round
``b2=0.999`` to 1.0.
"""

import functools
import math
import numbers
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from purax.core.errors import ConfigError, expect, expect_kind


def warmup_cosine(peak_learning_rate, *, warmup_steps: int, total_steps: int):
  """``step -> learning rate``: linear warmup from 0, cosine decay to 0.

  Written as ``peak * unit_schedule(step)`` so ``peak_learning_rate`` may be a
  traced float32 array (optax's own builder branches on the peak in Python).
  Loshchilov & Hutter 2017, "SGDR" (cosine); Goyal et al. 2017 (warmup).
  """
  unit = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=1.0, warmup_steps=warmup_steps,
      decay_steps=max(total_steps, warmup_steps + 1), end_value=0.0)
  return lambda count: peak_learning_rate * unit(count)


def global_norm(tree) -> jax.Array:
  """The L2 norm of all leaves together, float32 ``[]``, without overflow or underflow.

  ``optax.global_norm`` squares the values: gradients of ~1e20 give ``inf``
  (the square overflows float32) and values below ~1e-23 give 0 (it
  underflows). Here the values are divided by the largest magnitude first,
  so the norm is right (to float32 rounding) whenever it is itself a finite
  float32; it is ``inf`` / NaN when a value is.

  Args:
    tree: a pytree of float arrays, any float dtype (computed in float32).
  """
  leaves = [jnp.asarray(x).astype(jnp.float32) for x in jax.tree.leaves(tree)]
  if not leaves:
    return jnp.zeros((), jnp.float32)

  def rescaled():
    biggest = jnp.max(jnp.stack([jnp.max(jnp.abs(x), initial=0.0) for x in leaves]))
    scale = jnp.where(jnp.isfinite(biggest) & (biggest > 0), biggest, 1.0)
    total = sum(jnp.sum(jnp.square(x / scale)) for x in leaves)
    # A non-finite value: x / 1.0 keeps it, and the norm is inf or NaN as it should be.
    return scale * jnp.sqrt(total)

  # The plain sum of squares is exact enough unless it overflowed or
  # underflowed; only then (a branch taken at run time) is the second pass paid.
  plain = sum(jnp.sum(jnp.square(x)) for x in leaves)
  usable = jnp.isfinite(plain) & (plain > 1e-30)
  return jax.lax.cond(usable, lambda: jnp.sqrt(plain), rescaled)


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


def _adamw_cosine(peak_learning_rate, weight_decay, b1, b2, eps, clip_norm, *,
                  warmup_steps, total_steps, eps_root):
  schedule = warmup_cosine(peak_learning_rate, warmup_steps=warmup_steps,
                           total_steps=total_steps)
  return optax.chain(
      clip_by_global_norm(clip_norm, use_given_norm=True),
      optax.adamw(schedule, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                  weight_decay=weight_decay, mu_dtype=jnp.float32),
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


def adamw(*, learning_rate: float = 1e-3, total_steps: int, warmup_steps: int = 0,
          weight_decay: float = 1e-4, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, clip_norm: float = 1.0,
          eps_root: float = 0.0) -> ScheduledTransformation:
  """AdamW (Loshchilov & Hutter 2019) with a warmup-cosine schedule and clipping.

  Args:
    learning_rate: the peak learning rate, reached after ``warmup_steps``.
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

  Returns:
    An optax transformation whose state holds the six float hyperparameters
    as float32 ``[]`` arrays in ``opt_state.hyperparams``; its
    ``learning_rate(opt_state)`` is the rate the next update applies
    (``applied=True``: the last update's; :class:`ScheduledTransformation`).

  Raises:
    ConfigError: a value out of range or not finite (NaN, ``inf``), naming
      the field.
  """
  for name, value in (('learning_rate', learning_rate), ('weight_decay', weight_decay),
                      ('b1', b1), ('b2', b2), ('eps', eps), ('clip_norm', clip_norm),
                      ('eps_root', eps_root)):
    expect_kind(value, name, numbers.Real, 'a finite number')
    expect(math.isfinite(value), name, 'a finite number (a non-finite hyperparameter would '
           'turn every parameter into NaN)', value, ConfigError)
  for name, value in (('total_steps', total_steps), ('warmup_steps', warmup_steps)):
    expect_kind(value, name, numbers.Integral, 'an integer')
  expect(learning_rate >= 0, 'learning_rate', '>= 0', learning_rate, ConfigError)
  expect(total_steps >= 1, 'total_steps', '>= 1', total_steps, ConfigError)
  expect(0 <= warmup_steps, 'warmup_steps', '>= 0', warmup_steps, ConfigError)
  expect(0 <= b1 < 1, 'b1', 'in [0, 1)', b1, ConfigError)
  expect(0 <= b2 < 1, 'b2', 'in [0, 1)', b2, ConfigError)
  expect(clip_norm > 0, 'clip_norm', '> 0 (gradients are rescaled to at most this norm: 0 '
         'would zero them)', clip_norm, ConfigError)
  expect(weight_decay >= 0, 'weight_decay', '>= 0', weight_decay, ConfigError)
  expect(eps_root >= 0, 'eps_root', '>= 0', eps_root, ConfigError)
  expect(eps > 0 or eps_root > 0, 'eps', '> 0 (or eps_root > 0: with both 0 a gradient entry '
         'that is 0 from the start divides 0 by 0)', eps, ConfigError)
  return _adamw(float(learning_rate), int(total_steps), int(warmup_steps), float(weight_decay),
                float(b1), float(b2), float(eps), float(clip_norm), float(eps_root))


# One transformation per set of values: a Task rebuilt with the same values is
# equal to the first (its jitted step is not compiled again). Other values give
# another transformation (another compilation); to try learning rates without
# recompiling, keep one Task and set them in the state (purax.set_hyperparams, or a
# population).
@functools.lru_cache(maxsize=256)
def _adamw(learning_rate, total_steps, warmup_steps, weight_decay, b1, b2, eps, clip_norm,
           eps_root):
  factory = optax.inject_hyperparams(
      _adamw_cosine, static_args=('warmup_steps', 'total_steps', 'eps_root'),
      hyperparam_dtype=jnp.float32)
  tx = factory(peak_learning_rate=learning_rate, weight_decay=weight_decay,
               b1=b1, b2=b2, eps=eps, clip_norm=clip_norm,
               warmup_steps=int(warmup_steps), total_steps=int(total_steps),
               eps_root=eps_root)
  unit = warmup_cosine(1.0, warmup_steps=int(warmup_steps), total_steps=int(total_steps))

  def current(opt_state, *, applied: bool = False):
    # The schedule's count is the updates applied (a skipped update leaves it).
    count = jnp.maximum(opt_state.count - 1, 0) if applied else opt_state.count
    rate = opt_state.hyperparams['peak_learning_rate'] * unit(count)
    if applied:
      rate = jnp.where(opt_state.count > 0, rate, 0.0)
    return rate.astype(jnp.float32)

  return ScheduledTransformation(tx.init, tx.update, current)
