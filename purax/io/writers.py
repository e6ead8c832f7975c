"""Metric writers behind one tiny interface (after ``clu.metric_writers``).

``write_scalars(step, scalars)`` takes Python numbers (already on the host);
writers never touch the device. Use :func:`create_default_writer` for a run
directory: TensorBoard event files (tensorboardX, with the run's
hyperparameters for TensorBoard's HParams tab and its config as text),
``metrics.jsonl``, optionally the console and Weights & Biases.

Durability: the file writers flush at every ``write_scalars`` call (the loop
calls them at log and eval points only, before the checkpoint of that step is
started), so a killed process loses no record written before its last
committed checkpoint.

Your own writer is any object with the three methods of :class:`MetricWriter`;
``write_hparams``, ``write_text`` and ``write_histograms`` are optional
(called when present; a writer without one ignores that kind of record).
Next to the defaults: ``writers.MultiWriter([writers.create_default_writer(workdir),
LossPrinter()])``.

Example (``...`` in an output stands for any text):
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
  >>> class LossPrinter:
  ...   def write_scalars(self, step, scalars):
  ...     print(step, 'train/loss' in scalars)
  ...   def flush(self): pass
  ...   def close(self): pass
  >>> state = task.init(jax.random.key(0), batch)
  >>> state, _ = purax.fit(task, state, batches, steps=20,
  ...                      hooks=purax.hooks.standard(log_every=10, writer=LossPrinter()))
  10 True
  20 True

Only process 0 of a multi-host run writes (``fit`` calls the writer there only).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from purax.core.errors import ConfigError, expect
from purax.io import progress, safe_files, wandb_writer


class MetricWriter(Protocol):
  """What ``fit`` writes to. Optional extras, called when a writer has them:
  ``write_hparams(hparams: Mapping[str, Any])`` (once per run, before the first
  step), ``write_text(tag: str, text: str)`` and
  ``write_histograms(step: int, histograms: Mapping[str, np.ndarray])`` (value
  arrays of any shape, flattened; from :class:`purax.hooks.Histograms`).

  ``write_end(step: int, end: Mapping[str, Any])``: how the run ended
  (:meth:`purax.hooks.End.as_dict`), once, at its last step.

  Which writer takes what: :class:`TensorBoardWriter` the first three;
  :class:`JsonlWriter` scalars and the end, :class:`ConsoleWriter` scalars only (histograms
  would be megabytes of JSON per log point, or unreadable lines); the
  Weights & Biases writer scalars and hparams.
  """

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """Records ``scalars`` (``{'train/loss': 0.12, ...}``, Python floats) at ``step``."""

  def flush(self) -> None:
    """Makes everything written so far durable/visible."""

  def close(self) -> None:
    """Flushes and releases files or connections; no call follows."""


def hparam_values(config: Mapping[str, Any]) -> dict[str, Any]:
  """``config`` as HParams values: bool, int, float, str kept, None dropped,
  anything else (tuples, nested dicts) as its ``str``."""
  out = {}
  for key, value in config.items():
    if value is None:
      continue
    out[key] = value if isinstance(value, (bool, int, float, str)) else str(value)
  return out


def write_run_info(writer: MetricWriter, hparams: Mapping[str, Any],
                   config_text: str | None = None) -> None:
  """Sends a run's hyperparameters (and its config as text, tag ``config``) to
  the writers that take them; the others are left alone."""
  if hasattr(writer, 'write_hparams'):
    writer.write_hparams(hparam_values(hparams))
  if config_text is not None and hasattr(writer, 'write_text'):
    writer.write_text('config', config_text)


def json_number(value):
  value = float(value)
  return value if math.isfinite(value) else str(value)  # JSON has no NaN/inf


class JsonlWriter:
  """Appends one JSON object per call to ``path``: ``{"step", "time", ...scalars}``.

  Each record is written in one ``write`` and flushed before the call returns.
  Non-finite values are written as strings (``"nan"``): the file stays JSON.
  A symlink or non-regular file at ``path`` is refused (ConfigError, named).
  """

  def __init__(self, path: str):
    self._file = safe_files.open_file(path, 'a', encoding='utf-8')

  def write_scalars(self, step, scalars):
    record = {'step': int(step), 'time': time.time()}
    record.update({k: json_number(v) for k, v in scalars.items()})
    self._file.write(json.dumps(record, allow_nan=False) + '\n')
    self._file.flush()

  def write_end(self, step, end):
    """The run's end (:meth:`purax.hooks.End.as_dict`) as one record:
    ``{"step", "time", "status", "end": {...}}``."""
    record = {'step': int(step), 'time': time.time(), 'status': end['status'], 'end': dict(end)}
    self._file.write(json.dumps(record, allow_nan=False) + '\n')
    self._file.flush()

  def flush(self):
    self._file.flush()

  def close(self):
    self._file.close()


class TensorBoardWriter:
  """TensorBoard event files in ``logdir``, written synchronously.

  tensorboardX's ``SummaryWriter`` queues events for a thread and its
  ``flush`` does not wait for the queue; this writer uses tensorboardX's
  ``EventsWriter`` directly, so every event is in the file (flushed and
  fsynced) when ``write_scalars`` returns. ``purge_step``: a resumed run's
  first step; events of a killed run at or after it are hidden by TensorBoard
  (the resumed run writes them again), as with ``SummaryWriter(purge_step=)``.
  """

  def __init__(self, logdir: str, *, purge_step: int | None = None):
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event, SessionLog
    self._event = Event
    # The pid keeps a resumed run, started within the same second, off the
    # killed run's file name (the file is opened for writing, not appending).
    self._events = EventsWriter(os.path.join(logdir, 'events'), f'.{os.getpid()}')
    if purge_step is not None:
      self._events.write_event(Event(step=purge_step, wall_time=time.time(),
                                     session_log=SessionLog(status=SessionLog.START)))
    self._events.flush()

  def write_scalars(self, step, scalars):
    from tensorboardX.summary import scalar
    for name, value in scalars.items():
      self._events.write_event(self._event(wall_time=time.time(), step=int(step),
                                           summary=scalar(name, float(value))))
    self._events.flush()

  def write_hparams(self, hparams):
    """The HParams plugin's session-start record of ``hparams``, in this run's
    own event file (not a sub-run, as ``SummaryWriter.add_hparams`` would make).

    No experiment record: with none, TensorBoard builds the experiment from
    every run's session-start record, so its HParams tab marks the columns
    whose values differ between runs and offers every logged scalar as a
    metric column (an experiment record per run would fix the columns to the
    first run's and mark none as differing).
    """
    from tensorboardX.summary import hparams as hparams_summary
    _, session_start, _ = hparams_summary(hparam_values(hparams), {})
    self._events.write_event(self._event(wall_time=time.time(), summary=session_start))
    self._events.flush()

  def write_text(self, tag, text, step: int = 0):
    """Text for TensorBoard's Text tab (markdown; indented, so JSON shows as code)."""
    from tensorboardX.summary import text as text_summary
    body = '\n'.join('    ' + line for line in text.splitlines())
    self._events.write_event(self._event(wall_time=time.time(), step=int(step),
                                         summary=text_summary(tag, body)))
    self._events.flush()

  def write_histograms(self, step, histograms):
    """One TensorBoard histogram per ``{tag: array}`` (values flattened;
    non-finite values are left out, their count written as the scalar
    ``<tag>/nonfinite`` when there are any: TensorBoard's buckets cannot hold them)."""
    from tensorboardX.summary import histogram, scalar
    for tag, values in histograms.items():
      values = np.asarray(values, np.float64).ravel()
      finite = values[np.isfinite(values)]
      if finite.size < values.size:
        self._events.write_event(self._event(
            wall_time=time.time(), step=int(step),
            summary=scalar(f'{tag}/nonfinite', float(values.size - finite.size))))
      if finite.size:
        self._events.write_event(self._event(wall_time=time.time(), step=int(step),
                                             summary=histogram(tag, finite, 'auto')))
    self._events.flush()

  def flush(self):
    self._events.flush()

  def close(self):
    self._events.close()


#: The values of a record that measure the machine, not the training: they
#: differ between two runs that train alike (a resumed and a straight one).
TIMINGS = ('time', 'steps_per_sec', 'compile_s', 'tokens_per_sec', 'mfu')

#: Counters shown in a log line only when non-zero (they still go to every
#: file writer at every log point, so ``metrics.jsonl`` and TensorBoard keep
#: one column each): skipped updates, the current streak of them, the
#: compilation seconds of the window, early stopping's evaluations without
#: improvement, non-finite values left out of a histogram.
QUIET_WHEN_ZERO = ('train/skipped', 'train/skip_streak', 'compile_s', 'early_stopping/stale')


def _quiet(name: str, value) -> bool:
  counter = name in QUIET_WHEN_ZERO or name.endswith('/nonfinite')
  return counter and not np.any(np.asarray(value))


def _number(value) -> str:
  """``0.1234``; a population's ``[members]`` values as ``min..max``."""
  values = np.ravel(np.asarray(value, np.float64))
  if values.size == 1:
    return f'{values[0]:.4g}'
  finite = values[np.isfinite(values)]
  if not finite.size:
    return f'{values[0]:.4g}'
  return f'{finite.min():.4g}..{finite.max():.4g}'


def format_line(step: int, scalars: Mapping[str, Any]) -> str | None:
  """``[step 200] train/loss=0.1234 ...``: one log point as one line;
  :data:`QUIET_WHEN_ZERO` counters only when non-zero, a population's values
  as ``min..max`` over the members; None when nothing is left to show."""
  text = ' '.join(f'{k}={_number(v)}' for k, v in scalars.items() if not _quiet(k, v))
  return f'[step {int(step)}] {text}' if text else None


class ConsoleWriter:
  """One line per call (:func:`format_line`), a record of the ``purax`` logger
  at INFO (:func:`purax.io.progress.log_line`): printed on stdout where
  logging is not configured (through ``tqdm.write`` when tqdm is installed, so
  a live progress bar stays intact), routed or silenced by ``logging``
  otherwise (``logging.getLogger('purax').setLevel(logging.WARNING)``).

  The default writer of :func:`purax.hooks.standard` and of ``purax train``
  and ``purax sweep``.
  """

  def write_scalars(self, step, scalars):
    line = format_line(step, scalars)
    if line is not None:
      progress.log_line(line)

  def flush(self):
    pass

  def close(self):
    pass


class MultiWriter:
  """Forwards every call to several writers."""

  def __init__(self, writers: Sequence[MetricWriter]):
    self._writers = list(writers)

  def write_scalars(self, step, scalars):
    for w in self._writers:
      w.write_scalars(step, scalars)

  def write_hparams(self, hparams):
    for w in self._writers:
      if hasattr(w, 'write_hparams'):
        w.write_hparams(hparams)

  def write_text(self, tag, text):
    for w in self._writers:
      if hasattr(w, 'write_text'):
        w.write_text(tag, text)

  def write_histograms(self, step, histograms):
    for w in self._writers:
      if hasattr(w, 'write_histograms'):
        w.write_histograms(step, histograms)

  def write_end(self, step, end):
    for w in self._writers:
      if hasattr(w, 'write_end'):
        w.write_end(step, end)

  def flush(self):
    for w in self._writers:
      w.flush()

  def close(self):
    for w in self._writers:
      w.close()


def create_default_writer(workdir: str, *, console: bool = True,
                          wandb_project: str | None = None,
                          resume_step: int = 0) -> MultiWriter:
  """TensorBoard events and ``metrics.jsonl`` in ``workdir`` (+ console, and a
  :class:`purax.io.wandb_writer.WandbWriter` of ``wandb_project`` logging into
  ``workdir/wandb`` when given).

  ``resume_step``: the step a resumed run continues from (TensorBoard hides
  the killed run's events after it).
  """
  os.makedirs(workdir, exist_ok=True)
  writers = [JsonlWriter(os.path.join(workdir, 'metrics.jsonl')),
             TensorBoardWriter(workdir, purge_step=resume_step + 1 if resume_step else None)]
  if console:
    writers.append(ConsoleWriter())
  if wandb_project is not None:
    writers.append(wandb_writer.WandbWriter(wandb_project, directory=workdir,
                               name=os.path.basename(os.path.normpath(workdir))))
  return MultiWriter(writers)


def check_wandb(field: str) -> None:
  """Raises ConfigError naming ``field`` unless the ``wandb`` package is installed."""
  expect(importlib.util.find_spec('wandb') is not None, field,
         "the wandb package installed (pip install 'purax[wandb]')", 'no wandb', ConfigError)
