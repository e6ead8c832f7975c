"""The training state: one frozen pytree holding everything that changes.

Every leaf is an array, so a population of states (a leading member axis on
every leaf) is just ``jax.vmap(task.init)`` and ``jax.eval_shape(task.init)``
gives the abstract state used to restore checkpoints.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping

import jax
from flax import struct

PyTree = Any

#: The fields that held a guard's state before 0.3 -> the guard's key in
#: ``TrainState.guards`` (:mod:`purax.core.guards`).
LEGACY_GUARD_FIELDS = {'loss_scale': 'loss_scale', 'spike_window': 'spikes'}


class _Unset:
  """The default of a deprecated keyword: not given."""

  def __repr__(self):
    return '<not given>'


_UNSET = _Unset()


def _with_legacy_fields(guards, **fields):
  """``guards`` with the deprecated keywords' values (None: removed), warned about."""
  for field, value in fields.items():
    if value is not _UNSET:
      key = LEGACY_GUARD_FIELDS[field]
      warnings.warn(f'TrainState({field}=...) is deprecated (until 0.4): the state is '
                    f"guards={{'{key}': ...}}", DeprecationWarning, stacklevel=3)
      guards = {k: v for k, v in guards.items() if k != key}
      if value is not None:
        guards[key] = value
  return guards


class TrainState(struct.PyTreeNode):
  """Everything that changes during training, and nothing else.

  Attributes:
    step: int32 ``[]``, number of training steps taken so far (batches
      consumed: the data position), updates skipped by the non-finite guard
      included; the optimizer's own count in ``opt_state`` (which drives the
      schedule) counts applied updates only.
    params: trainable parameters (float32 masters by default).
    model_state: non-trainable flax collections, e.g. ``{'batch_stats': ...}``;
      ``{}`` for models without any. Threaded into the loss and returned out.
    opt_state: the optax state. Hyperparameters live in it as float32 arrays
      (``optax.inject_hyperparams``), so new values never recompile.
    rng: a typed PRNG key (``jax.random.key``); the key of step ``s`` is
      ``jax.random.fold_in(rng, s)``, so randomness is a pure function of
      (seed, step) and resume is exact.
    hparams: loss and model hyperparameters as float32 ``[]`` arrays, e.g.
      ``{'label_smoothing': 0.1}``; arrays so that they can be vmapped.
    guards: the step guards' state (:mod:`purax.core.guards`), a dict keyed
      by the guard's name: ``'loss_scale'`` (a
      :class:`purax.core.loss_scale.LossScale`) when the task scales the loss
      (float16), ``'spikes'`` (a :class:`purax.core.spikes.SpikeWindow`, the
      loss-spike guard's recent history) when it has a ``spike_guard``; ``{}``
      (no leaves) without either.

  Deprecated (until 0.4): the keywords ``loss_scale=`` and ``spike_window=``
  (of the constructor and ``replace``) and the read-only attributes
  ``state.loss_scale`` and ``state.spike_window`` still work, with a
  ``DeprecationWarning``: they are ``guards['loss_scale']`` and
  ``guards['spikes']`` (None when absent; ``None`` given removes the entry).
  """

  step: jax.Array
  params: PyTree
  model_state: PyTree
  opt_state: PyTree
  rng: jax.Array
  hparams: PyTree
  guards: Mapping[str, PyTree] = struct.field(default_factory=dict)

  def __init__(self, step: jax.Array, params: PyTree, model_state: PyTree, opt_state: PyTree,
               rng: jax.Array, hparams: PyTree, guards: Mapping[str, PyTree] | None = None, *,
               loss_scale: PyTree = _UNSET, spike_window: PyTree = _UNSET) -> None:
    # Every unflatten of a state calls this: the common path sets the fields only.
    if guards is None:
      guards = {}
    if loss_scale is not _UNSET or spike_window is not _UNSET:
      guards = _with_legacy_fields(guards, loss_scale=loss_scale, spike_window=spike_window)
    put = object.__setattr__
    put(self, 'step', step)
    put(self, 'params', params)
    put(self, 'model_state', model_state)
    put(self, 'opt_state', opt_state)
    put(self, 'rng', rng)
    put(self, 'hparams', hparams)
    put(self, 'guards', guards)

  @property
  def loss_scale(self) -> PyTree:
    """Deprecated (until 0.4): ``state.guards.get('loss_scale')``."""
    warnings.warn("TrainState.loss_scale is deprecated (until 0.4): use "
                  "state.guards.get('loss_scale')", DeprecationWarning, stacklevel=2)
    return self.guards.get('loss_scale')

  @property
  def spike_window(self) -> PyTree:
    """Deprecated (until 0.4): ``state.guards.get('spikes')``."""
    warnings.warn("TrainState.spike_window is deprecated (until 0.4): use "
                  "state.guards.get('spikes')", DeprecationWarning, stacklevel=2)
    return self.guards.get('spikes')

  def step_key(self) -> jax.Array:
    """The typed PRNG key of the current step: ``fold_in(rng, step)``."""
    return jax.random.fold_in(self.rng, self.step)
