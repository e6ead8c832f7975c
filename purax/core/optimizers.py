"""More optimizers, built as :func:`purax.adamw` is (:func:`purax.core.optim.scheduled`):
global-norm clipping first, every float hyperparameter injected (float32, in
``opt_state.hyperparams``: set, swept and perturbed without recompiling),
the weight-decay mask :func:`purax.core.optim.matrices` by default.

- :func:`sgd`: SGD with momentum, L2 weight decay, warmup + cosine.
- :func:`muon`: Muon (Jordan 2024; Liu et al. 2025) on the hidden layers'
  matrices (:func:`purax.core.muon.muon_leaves`: attention, MLP and convolution kernels,
  scanned stacks layer by layer), AdamW on embeddings, head, norms and
  biases, warmup + cosine.
- :func:`schedule_free_adamw`: ``optax.contrib.schedule_free`` around AdamW
  (Defazio et al. 2024), warmup then constant; evaluate it at
  :func:`schedule_free_eval_params` (``purax.Task(eval_params=...)``).

Any other optax transformation works in a :class:`purax.Task` as it is;
these add what the command line and populations need (injected
hyperparameters under the names of :data:`purax.core.hparams.BOUNDS`, and a
schedule :func:`purax.core.hparams.get` can report).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from purax.core import bounds
from purax.core import muon as muon_lib
from purax.core.errors import ConfigError, expect
from purax.core.muon import MuonLeaf, format_muon_leaves, muon_leaves  # noqa: F401
from purax.core.optim import (ScheduledTransformation, check_mask, check_steps,
                              clip_by_global_norm, matrices, scheduled)


def _check(total_steps, warmup_steps, mask, **hyperparams):
  """The checks every builder makes: each hyperparameter against its interval
  of :data:`purax.core.bounds.BOUNDS` (the one table), the schedule's lengths
  and the weight-decay mask."""
  bounds.check(**hyperparams)
  check_steps(total_steps, warmup_steps)
  check_mask(mask)


def _sgd(learning_rate, momentum, weight_decay, clip_norm, *, schedule, nesterov,
         weight_decay_mask):
  return optax.chain(clip_by_global_norm(clip_norm, use_given_norm=True),
                     optax.add_decayed_weights(weight_decay, weight_decay_mask),
                     optax.sgd(schedule(learning_rate), momentum=momentum,
                               nesterov=nesterov))


def sgd(*, learning_rate: float = 0.1, total_steps: int, warmup_steps: int = 0,
        momentum: float = 0.9, nesterov: bool = False, weight_decay: float = 0.0,
        clip_norm: float = 1.0, weight_decay_mask=matrices) -> ScheduledTransformation:
  """SGD with (heavy-ball or Nesterov) momentum, warmup-cosine and clipping.

  Weight decay is L2 (``weight_decay * params`` added to the gradients before
  the momentum), on the leaves of ``weight_decay_mask``.

  Args:
    learning_rate: peak learning rate. total_steps, warmup_steps: the schedule.
    momentum: in ``[0, 1)``; nesterov: Nesterov's momentum (static).
    weight_decay, weight_decay_mask, clip_norm: as in :func:`purax.adamw`.

  Returns:
    A :class:`purax.core.optim.ScheduledTransformation`; injected:
    ``learning_rate``, ``momentum``, ``weight_decay``, ``clip_norm``.

  Raises:
    ConfigError: a value outside its interval of :data:`purax.core.bounds.BOUNDS`
      or not finite, naming it.

  Example: ``purax.Task(model, tx=purax.core.optimizers.sgd(total_steps=1000))``.
  """
  _check(total_steps, warmup_steps, weight_decay_mask, learning_rate=learning_rate,
         clip_norm=clip_norm, weight_decay=weight_decay, momentum=momentum)
  return scheduled(_sgd, warmup_steps=warmup_steps, total_steps=total_steps,
                   hyperparams=dict(learning_rate=learning_rate, momentum=momentum,
                                    weight_decay=weight_decay, clip_norm=clip_norm),
                   static=dict(nesterov=bool(nesterov), weight_decay_mask=weight_decay_mask))


def _scale_by_muon_leaves(momentum, eps, overrides):
  """Muon's direction on the leaves :func:`purax.core.muon.muon_leaves` gives
  it: Nesterov momentum orthogonalised by 5 Newton-Schulz iterations along
  each leaf's axes (``optax.contrib.scale_by_muon``), then Jordan's width
  scale (as ``optax.contrib.muon``)."""
  dims = functools.partial(muon_lib.dimension_numbers, muon_leaves=overrides)

  def scale(updates, state, params=None):
    del params
    spec = dims(updates)
    updates = jax.tree.map(
        lambda u, d: muon_lib.width_scale(u, d) if isinstance(
            d, optax.contrib.MuonDimensionNumbers) else u,
        updates, spec, is_leaf=_is_dims_or_masked)
    return updates, state

  return optax.chain(
      optax.contrib.scale_by_muon(beta=momentum, eps=eps, mu_dtype=jnp.float32,
                                  nesterov=True, weight_dimension_numbers=dims),
      optax.GradientTransformation(lambda params: optax.EmptyState(), scale))


def _is_dims_or_masked(x) -> bool:
  return x is None or isinstance(x, (optax.contrib.MuonDimensionNumbers, optax.MaskedNode))


def _muon(learning_rate, momentum, b1, b2, eps, weight_decay, clip_norm, *, schedule,
          weight_decay_mask, muon_leaves):
  # optax.contrib.muon's two parts (its Muon chain and its AdamW, Nesterov
  # as there), with the leaves chosen by purax.core.muon and the decoupled
  # weight decay (-lr * wd * p in both parts, as there) masked over the whole tree.
  return optax.chain(
      clip_by_global_norm(clip_norm, use_given_norm=True),
      optax.partition(
          {'muon': _scale_by_muon_leaves(momentum, eps, muon_leaves),
           'adamw': optax.scale_by_adam(b1=b1, b2=b2, eps=eps, mu_dtype=jnp.float32,
                                        nesterov=True)},
          functools.partial(muon_lib.labels, muon_leaves=muon_leaves)),
      optax.add_decayed_weights(weight_decay, weight_decay_mask),
      optax.scale_by_learning_rate(schedule(learning_rate)))


def muon(*, learning_rate: float = 0.02, total_steps: int, warmup_steps: int = 0,
         momentum: float = 0.95, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         weight_decay: float = 0.0, clip_norm: float = 1.0,
         weight_decay_mask=matrices, muon_leaves=None) -> ScheduledTransformation:
  """Muon on the hidden layers' matrices, AdamW on the rest; warmup-cosine and clipping.

  Muon (Jordan 2024): the Nesterov momentum of each matrix orthogonalised by
  5 Newton-Schulz iterations (``optax.contrib.scale_by_muon``) and scaled by
  ``sqrt(max(1, fan_out / fan_in))``. Which leaves are matrices, and along
  which axes (attention's ``[embed, 3, heads, head_dim]`` is three
  ``[embed, heads * head_dim]`` matrices; a convolution ``[*window, in,
  out]`` the matrix ``[in * prod(window), out]``; a scanned stack's layer
  axis a batch axis): :func:`purax.core.muon.muon_leaves`, whose table
  ``purax train --optimizer muon --dry-run`` prints. Embeddings, the output
  head, norms and biases get AdamW (Nesterov, as ``optax.contrib.muon``'s).

  References: Jordan, "Muon: An optimizer for hidden layers in neural
  networks" (2024; modded-nanogpt); Liu et al. 2025, "Muon is Scalable for
  LLM Training".

  Args:
    learning_rate: peak learning rate of both parts (optax's default
      ``adam_learning_rate=None``). total_steps, warmup_steps: the schedule.
    momentum: Muon's momentum ``beta`` (optax's default 0.95).
    b1, b2, eps: the AdamW part's (``eps`` also Muon's Newton-Schulz
      normalisation's).
    weight_decay: decoupled weight decay, ``-learning_rate * weight_decay *
      param`` per step in both parts (optax's convention for Muon), on the
      leaves of ``weight_decay_mask``.
    weight_decay_mask: as in :func:`purax.adamw`: :func:`purax.core.optim.matrices`
      (default: every leaf of ``ndim >= 2``, Muon's and the embeddings and
      head; not vectors), None (every leaf), or a function / pytree of bools.
    clip_norm: as in :func:`purax.adamw`.
    muon_leaves: None (the rule of :mod:`purax.core.muon`) or overrides
      ``{regex: optax.contrib.MuonDimensionNumbers(reduction_axis,
      output_axis) or None}``: the first pattern that fully matches a leaf's
      path (``layers_0/attention/qkv``) decides it, None meaning AdamW.

  Returns:
    A :class:`purax.core.optim.ScheduledTransformation`; injected:
    ``learning_rate``, ``momentum``, ``b1``, ``b2``, ``eps``,
    ``weight_decay``, ``clip_norm``.

  Raises:
    ConfigError: a value out of range or not finite, a bad mask or override,
      naming it (an override pattern matching no leaf: at ``init``).

  Example: ``purax.Task(model, tx=muon(total_steps=1000, muon_leaves={r'.*/wo':
  None}))`` keeps the MLP output kernels on AdamW.
  """
  _check(total_steps, warmup_steps, weight_decay_mask, learning_rate=learning_rate,
         clip_norm=clip_norm, weight_decay=weight_decay, momentum=momentum, b1=b1, b2=b2, eps=eps)
  expect(eps > 0, 'eps', '> 0 (Muon divides by a norm plus eps)', eps, ConfigError)
  return scheduled(_muon, warmup_steps=warmup_steps, total_steps=total_steps,
                   hyperparams=dict(learning_rate=learning_rate, momentum=momentum, b1=b1,
                                    b2=b2, eps=eps, weight_decay=weight_decay,
                                    clip_norm=clip_norm),
                   static=dict(weight_decay_mask=weight_decay_mask,
                               muon_leaves=muon_lib.check_overrides(muon_leaves) or None))


def _schedule_free_adamw(learning_rate, b1, b2, eps, weight_decay, clip_norm, *,
                         schedule, weight_decay_mask):
  # optax.contrib.schedule_free_adamw, with a weight-decay mask.
  learning_rate = schedule(learning_rate)
  base = optax.chain(
      optax.scale_by_rms(decay=b2, eps=eps, eps_in_sqrt=False, bias_correction=True),
      optax.add_decayed_weights(weight_decay, weight_decay_mask),
      optax.scale_by_learning_rate(learning_rate))
  return optax.chain(clip_by_global_norm(clip_norm, use_given_norm=True),
                     optax.contrib.schedule_free(base, learning_rate=learning_rate, b1=b1))


def schedule_free_adamw(*, learning_rate: float = 2.5e-3, warmup_steps: int = 0,
                        total_steps: int = 1, b1: float = 0.9, b2: float = 0.999,
                        eps: float = 1e-8, weight_decay: float = 0.0, clip_norm: float = 1.0,
                        weight_decay_mask=matrices) -> ScheduledTransformation:
  """Schedule-free AdamW (Defazio et al. 2024, "The Road Less Scheduled"):
  ``optax.contrib.schedule_free_adamw`` with clipping and a weight-decay mask;
  warmup then a constant learning rate (no decay: the averaging replaces it).

  The params it trains are the gradient points ``y``; evaluate (and export)
  the average ``x``: ``purax.Task(..., eval_params=schedule_free_eval_params)``.

  Args:
    learning_rate: the rate after warmup. warmup_steps: linear warmup.
    total_steps: unused (no decay), accepted as the other builders take it.
    b1: the interpolation between ``x`` and ``z`` (> 0); b2, eps: the second
      moment's. weight_decay, weight_decay_mask, clip_norm: as in :func:`purax.adamw`.

  Returns:
    A :class:`purax.core.optim.ScheduledTransformation`; injected:
    ``learning_rate``, ``b1``, ``b2``, ``eps``, ``weight_decay``, ``clip_norm``.

  Raises:
    ConfigError: a value outside its interval of :data:`purax.core.bounds.BOUNDS`
      or not finite, naming it.
  """
  _check(max(total_steps, 1), warmup_steps, weight_decay_mask, learning_rate=learning_rate,
         clip_norm=clip_norm, weight_decay=weight_decay, b1=b1, b2=b2, eps=eps)
  expect(b1 > 0, 'b1', '> 0 (schedule-free interpolates with it)', b1, ConfigError)
  expect(eps > 0, 'eps', '> 0 (the second moment divides by its root plus eps)', eps,
         ConfigError)
  return scheduled(_schedule_free_adamw, schedule='constant', warmup_steps=warmup_steps,
                   total_steps=1,
                   hyperparams=dict(learning_rate=learning_rate, b1=b1, b2=b2, eps=eps,
                                    weight_decay=weight_decay, clip_norm=clip_norm),
                   static=dict(weight_decay_mask=weight_decay_mask))


def _is_schedule_free(x) -> bool:
  return isinstance(x, optax.contrib.ScheduleFreeState)


def schedule_free_eval_params(state):
  """The params to evaluate a schedule-free run at (``x``, the average):
  ``optax.contrib.schedule_free_eval_params`` of the ``ScheduleFreeState``
  found anywhere in ``state.opt_state`` (inside ``inject_hyperparams``,
  ``optax.chain``, ``optax.multi_transform``, ...). A function of the state,
  for ``purax.Task(eval_params=...)``.

  Leaves the schedule-free optimizer does not train (another
  ``multi_transform`` subset: a frozen backbone) are their params.

  Raises:
    ConfigError: ``state.opt_state`` holds no (or more than one) schedule-free state.
  """
  found = [x for x in jax.tree.leaves(state.opt_state, is_leaf=_is_schedule_free)
           if _is_schedule_free(x)]
  expect(len(found) == 1, 'state.opt_state', 'one optax.contrib.ScheduleFreeState (a '
         'schedule-free optimizer)', f'{len(found)}', ConfigError)
  b1 = found[0].b1

  def at_x(y, z):   # optax.contrib.schedule_free_eval_params, leaf by leaf
    return y if isinstance(z, optax.MaskedNode) else (y - (1.0 - b1) * z) / b1
  return jax.tree.map(at_x, state.params, found[0].z)
