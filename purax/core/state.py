"""The training state: one frozen pytree holding everything that changes.

Every leaf is an array, so a population of states (a leading member axis on
every leaf) is just ``jax.vmap(task.init)`` and ``jax.eval_shape(task.init)``
gives the abstract state used to restore checkpoints.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import struct

PyTree = Any


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
    loss_scale: dynamic loss-scale state (:class:`purax.core.loss_scale.LossScale`)
      when the task scales the loss (float16), else ``None`` (no leaves).
    spike_window: the loss-spike guard's recent history
      (:class:`purax.core.spikes.SpikeWindow`) when the task has a
      ``spike_guard``, else ``None`` (no leaves: a state without one, and a
      checkpoint written before the guard existed, have the same leaves).
  """

  step: jax.Array
  params: PyTree
  model_state: PyTree
  opt_state: PyTree
  rng: jax.Array
  hparams: PyTree
  loss_scale: PyTree = None
  spike_window: PyTree = None

  def step_key(self) -> jax.Array:
    """The typed PRNG key of the current step: ``fold_in(rng, step)``."""
    return jax.random.fold_in(self.rng, self.step)
