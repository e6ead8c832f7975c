"""Metric writers behind one tiny interface (after ``clu.metric_writers``).

``write_scalars(step, scalars)`` takes Python numbers (already on the host);
writers never touch the device. Use :func:`create_default_writer` for a run
directory: TensorBoard event files (tensorboardX), ``metrics.jsonl`` and,
optionally, the console.

Durability: the file writers flush at every ``write_scalars`` call (the loop
calls them at log and eval points only, before the checkpoint of that step is
started), so a killed process loses no record written before its last
committed checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Mapping, Protocol, Sequence


class MetricWriter(Protocol):
  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None: ...
  def flush(self) -> None: ...
  def close(self) -> None: ...


def _number(value):
  value = float(value)
  return value if math.isfinite(value) else str(value)  # JSON has no NaN/inf


class JsonlWriter:
  """Appends one JSON object per call to ``path``: ``{"step", "time", ...scalars}``.

  Each record is written in one ``write`` and flushed before the call returns.
  Non-finite values are written as strings (``"nan"``): the file stays JSON.
  """

  def __init__(self, path: str):
    self._file = open(path, 'a', encoding='utf-8')

  def write_scalars(self, step, scalars):
    record = {'step': int(step), 'time': time.time()}
    record.update({k: _number(v) for k, v in scalars.items()})
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

  def flush(self):
    self._events.flush()

  def close(self):
    self._events.close()


class ConsoleWriter:
  """One line per call: ``[step 200] train/loss=0.1234 ...`` (through tqdm.write)."""

  def __init__(self, stream=None):
    self._stream = stream

  def write_scalars(self, step, scalars):
    from tqdm import tqdm
    text = ' '.join(f'{k}={v:.4g}' for k, v in scalars.items())
    tqdm.write(f'[step {int(step)}] {text}', file=self._stream or sys.stdout)

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

  def flush(self):
    for w in self._writers:
      w.flush()

  def close(self):
    for w in self._writers:
      w.close()


def create_default_writer(workdir: str, *, console: bool = True,
                          resume_step: int = 0) -> MultiWriter:
  """TensorBoard events and ``metrics.jsonl`` in ``workdir`` (+ console).

  ``resume_step``: the step a resumed run continues from (TensorBoard hides
  the killed run's events after it).
  """
  os.makedirs(workdir, exist_ok=True)
  writers = [JsonlWriter(os.path.join(workdir, 'metrics.jsonl')),
             TensorBoardWriter(workdir, purge_step=resume_step + 1 if resume_step else None)]
  if console:
    writers.append(ConsoleWriter())
  return MultiWriter(writers)
