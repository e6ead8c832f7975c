"""An update saved to be replayed in another process: the state before it,
its batch, and what was found (:class:`purax.inspect.nan.Report`).

Saved by :class:`purax.hooks.NonFiniteReplay` under a run's directory
(``WORKDIR/nonfinite/STEP/``, a checkpoint of :class:`Checkpointer`:
``{'state': TrainState, 'batch': batch}`` with ``{'report': ...}`` in its
JSON, verified on restore like any checkpoint) and read back by ``purax
debug-nan --workdir DIR --step STEP``, which replays it in a fresh process
(:func:`purax.inspect.nan.find`, ``purax.find_nonfinite``, on what
:func:`load_update` reads).

Example: an update saved, then read back against the run's abstract state:

  >>> from purax.io.checkpoint import replay
  >>> from purax.inspect.nan import Report
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=optax.sgd(0.1))
  >>> state = task.init(jax.random.key(0), batch)
  >>> found = Report(step=0, where='batch', path="batch['x']", detail='holds 1 NaN')
  >>> replay.save_update('runs/mine/nonfinite', state, batch, found.as_dict())
  >>> replay.saved_steps('runs/mine/nonfinite')
  [0]
  >>> abstract = jax.eval_shape(task.init, jax.random.key(0), batch)
  >>> state, saved_batch, report = replay.load_update('runs/mine/nonfinite', 0, abstract, batch)
  >>> report['where'], saved_batch['x'].shape
  ('batch', (64, 8, 8, 1))
"""

from __future__ import annotations

import os
from typing import Any

import jax

from purax.io.checkpoint.manager import Checkpointer

#: The directory of a run's saved updates, under the run directory.
DIRECTORY = 'nonfinite'


def save_update(directory: str, state, batch, report: dict, *, keep: int = 3) -> None:
  """Saves the update of ``state.step`` (synchronously; the newest ``keep`` are kept).

  Raises:
    CheckpointError: the directory cannot be written.
  """
  step = int(jax.device_get(state.step))
  with Checkpointer(directory, keep_last=keep, async_save=False, interval_s=None) as ckpt:
    ckpt.save(step, {'state': state, 'batch': batch}, extra={'report': report})


def saved_steps(directory: str) -> list[int]:
  """The steps of the updates saved in ``directory`` (oldest first; [] when none)."""
  if not os.path.isdir(directory):
    return []
  with Checkpointer(directory, interval_s=None) as ckpt:
    return ckpt.steps()


def load_update(directory: str, step: int, abstract_state, abstract_batch
                ) -> tuple[Any, Any, dict]:
  """``(state, batch, report)`` of the update saved at ``step``.

  Args:
    directory: where :func:`save_update` wrote (a run's ``nonfinite/``).
    step: the update's ``state.step``.
    abstract_state, abstract_batch: their structure, shapes and dtypes
      (``jax.ShapeDtypeStruct`` leaves or arrays: e.g. the run's abstract
      state and a batch of the run).

  Raises:
    CheckpointError: no such update (naming the saved steps), or unreadable;
    CheckpointMismatchError: another structure than the abstract ones.
  """
  with Checkpointer(directory, interval_s=None) as ckpt:
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                            {'state': abstract_state, 'batch': abstract_batch})
    tree, extra, _ = ckpt.restore(abstract, step)
  return tree['state'], tree['batch'], extra.get('report', {})
