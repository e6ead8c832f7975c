"""Checkpoints of a TrainState with orbax's ``CheckpointManager``.

Typed PRNG keys are stored as their raw key data and re-wrapped on restore.
Restoring needs an abstract target (``jax.eval_shape(task.init, ...)``), so
shapes and dtypes are checked against what the code expects.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp

from purax.core.state import TrainState


def _is_typed_key(x) -> bool:
  return hasattr(x, 'dtype') and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_storable(state: TrainState):
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_typed_key(x) else x, state)


def _abstract_storable(abstract_state: TrainState):
  def convert(x):
    if _is_typed_key(x):
      return jax.eval_shape(jax.random.key_data, x)
    return x
  return jax.tree.map(convert, abstract_state)


def _key_impl(x):
  # Works for concrete keys and for jax.ShapeDtypeStruct targets alike.
  return x.dtype._impl  # pylint: disable=protected-access


def _from_storable(stored, abstract_state: TrainState):
  return jax.tree.map(
      lambda s, a: jax.random.wrap_key_data(s, impl=_key_impl(a)) if _is_typed_key(a) else s,
      stored, abstract_state, is_leaf=lambda x: x is None)


def manager(directory: str, *, max_to_keep: int | None = 3) -> ocp.CheckpointManager:
  """An orbax ``CheckpointManager`` over ``directory`` (created if missing)."""
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
  return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def save(mngr: ocp.CheckpointManager, step: int, state: TrainState) -> None:
  """Saves ``state`` as checkpoint ``step`` (asynchronous; see ``wait``)."""
  mngr.save(int(step), args=ocp.args.StandardSave(_to_storable(state)))


def restore(mngr: ocp.CheckpointManager, abstract_state: TrainState,
            step: int | None = None) -> TrainState:
  """Restores checkpoint ``step`` (default: the newest) into ``abstract_state``'s shapes.

  Raises:
    FileNotFoundError: no checkpoint in the directory.
  """
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f'checkpoint directory {mngr.directory}: expected a '
                            'committed checkpoint, got none')
  target = _abstract_storable(abstract_state)
  stored = mngr.restore(step, args=ocp.args.StandardRestore(target))
  return _from_storable(stored, abstract_state)
