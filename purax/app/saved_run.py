"""A run directory in Python: :func:`open_run` (``purax.open_run``) gives what
``purax train`` left — its config, its task, its restored state — read-only,
for research code that goes on from a command-line run.

Example (a run trained by ``purax train --steps 50 --workdir runs/digits``)::

    import purax
    run = purax.open_run('runs/digits')              # the newest checkpoint
    logits = run.predict(run.data.x_test[:8])        # float32 [8, 10]
    print(run.step, run.end, run.evaluate())         # the metrics `purax eval` prints
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np

from purax.app import runs
from purax.core.errors import ConfigError, expect, expect_kind
from purax.hooks.record import End
from purax.io.checkpoint import Checkpointer, CheckpointError


@dataclasses.dataclass(frozen=True)
class Run:
  """A ``purax train`` run, opened read-only (:func:`open_run`).

  Attributes:
    workdir: the run directory.
    config: its :class:`purax.app.config.TrainConfig` (``config.json``).
    task: the :class:`purax.Task` it trained (model, optimizer, loss).
    state: the restored :class:`purax.TrainState` (on the default device).
    step: the checkpoint's step (int).
    end: how the run had ended (:class:`purax.hooks.End`), or None while it
      was still training when that checkpoint was saved.
    data: its data set (``x_train``, ``y_train``, ``x_test``, ``y_test``,
      ``num_classes``), or None when opened with ``need_data=False``.
    job: everything ``purax train`` built for it (:class:`purax.app.job.Job`).
  """

  workdir: str
  config: Any
  task: Any
  state: Any
  step: int
  end: End | None
  data: Any
  job: Any = dataclasses.field(repr=False)

  def predict(self, inputs) -> jax.Array:
    """The model's outputs for ``inputs`` (``[batch, *input_shape]``, float32;
    a language model's int32 token ids ``[batch, seq_len]``): logits
    ``[batch, num_classes]`` (an LM's ``[batch, seq_len, vocab]``), in
    evaluation mode (no dropout), at :meth:`purax.Task.evaluation_params`."""
    return self.task.predict(self.state, np.asarray(inputs))

  def evaluate(self, batch_size: int | None = None) -> dict[str, float]:
    """The metrics of the run's test split (what ``purax eval`` prints).

    Raises:
      ConfigError: the run was opened without its data.
    """
    expect(self.data is not None, 'data', "the run's data (open_run(..., need_data=True))",
           None, ConfigError)
    return runs.evaluate_state(self.job, self.state, batch_size)


def open_run(workdir: str, *, best: bool = False, need_data: bool = True) -> Run:
  """Opens a ``purax train`` run directory read-only: its config, its task and
  its restored state. Nothing in the directory is created, changed or locked,
  so it may be read while the run trains.

  Args:
    workdir: the run directory (``purax train --workdir``).
    best: restore the best checkpoint by the run's ``--best-metric`` (a run of
      ``--keep-best``) instead of the newest.
    need_data: load the run's data set (for :meth:`Run.evaluate`); False
      rebuilds the run from the shapes its checkpoint records (no data file
      needed), and ``Run.data`` is None.

  Returns:
    A :class:`Run`.

  Raises:
    ConfigError: ``workdir`` is not a purax run directory (no ``config.json``).
    CheckpointError: it has no readable checkpoint (with ``best``: none that
      records the best metric).
    CheckpointMismatchError: this code's model differs from the checkpoint's.
  """
  expect_kind(workdir, 'workdir', (str, os.PathLike), 'a run directory')
  for name, value in (('best', best), ('need_data', need_data)):
    expect_kind(value, name, bool, 'True or False')
  workdir = os.fspath(workdir)
  expect(os.path.isfile(os.path.join(workdir, 'config.json')), 'workdir',
         'a purax train run directory (with config.json)', repr(workdir), ConfigError)
  job, state = runs.restore_run(workdir, need_data=need_data, best=best)
  step = int(jax.device_get(state.step))
  end = None
  try:
    with Checkpointer(os.path.join(workdir, 'checkpoints'), read_only=True) as reader:
      saved = reader.read_extra(step).get('end')
    end = None if saved is None else End.from_dict(saved)
  except (CheckpointError, ValueError):
    end = None
  return Run(workdir, job.config, job.task, state, step, end, job.data, job)
