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
import sys
import time
from typing import Any, Mapping, Protocol, Sequence

from purax.core.errors import ConfigError, expect
from purax.io import progress, safe_files, wandb_writer


class MetricWriter(Protocol):
  """What ``fit`` writes to. Optional extras, called when a writer has them:
  ``write_hparams(hparams: Mapping[str, Any])`` (once per run, before the first
  step), ``write_text(tag: str, text: str)`` and
  ``write_histograms(step: int, histograms: Mapping[str, np.ndarray])`` (value
  arrays of any shape, flattened; from :class:`purax.hooks.Histograms`).

  Which writer takes what: :class:`TensorBoardWriter` all three;
  :class:`JsonlWriter` and :class:`ConsoleWriter` scalars only (histograms
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

  def flush(self):
    self._file.flush()

  def close(self):
    self._file.close()


#: Scalars the HParams tab shows per run (written by ``fit`` under these tags).
HPARAM_METRICS = ('eval/accuracy', 'eval/loss', 'train/loss')


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

  def write_hparams(self, hparams, metrics: Sequence[str] = HPARAM_METRICS):
    """The HParams plugin's experiment and session records, in this run's own
    event file (not a sub-run, as ``SummaryWriter.add_hparams`` would make),
    so the HParams tab shows this run's ``metrics`` scalars next to ``hparams``."""
    from tensorboardX.summary import hparams as hparams_summary
    for summary in hparams_summary(hparam_values(hparams), {m: 0.0 for m in metrics}):
      self._events.write_event(self._event(wall_time=time.time(), summary=summary))
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
    import numpy as np
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


class ConsoleWriter:
  """One line per call: ``[step 200] train/loss=0.1234 ...``, flushed (through
  ``tqdm.write`` when tqdm is installed, so a live progress bar stays intact)."""

  def __init__(self, stream=None):
    self._stream = stream

  def write_scalars(self, step, scalars):
    text = ' '.join(f'{k}={v:.4g}' for k, v in scalars.items())
    progress.write(f'[step {int(step)}] {text}', self._stream or sys.stdout)

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
