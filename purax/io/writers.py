"""Metric writers behind one tiny interface (after ``clu.metric_writers``).

``write_scalars(step, scalars)`` takes Python numbers (already on the host);
writers never touch the device. Use :func:`create_default_writer` for a run
directory: TensorBoard event files (tensorboardX), ``metrics.jsonl`` and,
optionally, the console.
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
  """Appends one JSON object per call to ``path``: ``{"step", "time", ...scalars}``."""

  def __init__(self, path: str):
    self._file = open(path, 'a', encoding='utf-8')

  def write_scalars(self, step, scalars):
    record = {'step': int(step), 'time': time.time()}
    record.update({k: _number(v) for k, v in scalars.items()})
    self._file.write(json.dumps(record) + '\n')

  def flush(self):
    self._file.flush()

  def close(self):
    self._file.close()


class TensorBoardWriter:
  """TensorBoard event files in ``logdir`` through ``tensorboardX.SummaryWriter``."""

  def __init__(self, logdir: str):
    from tensorboardX import SummaryWriter
    self._writer = SummaryWriter(logdir=logdir)

  def write_scalars(self, step, scalars):
    for name, value in scalars.items():
      self._writer.add_scalar(name, float(value), global_step=int(step))

  def flush(self):
    self._writer.flush()

  def close(self):
    self._writer.close()


class ConsoleWriter:
  """One line per call: ``[step 200] train/loss=0.1234 ...``, flushed (through
  ``tqdm.write`` when tqdm is installed, so a live progress bar stays intact)."""

  def __init__(self, stream=None):
    self._stream = stream

  def write_scalars(self, step, scalars):
    from purax.io import progress
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

  def flush(self):
    for w in self._writers:
      w.flush()

  def close(self):
    for w in self._writers:
      w.close()


def create_default_writer(workdir: str, *, console: bool = True) -> MultiWriter:
  """TensorBoard events and ``metrics.jsonl`` in ``workdir`` (+ console)."""
  os.makedirs(workdir, exist_ok=True)
  writers = [JsonlWriter(os.path.join(workdir, 'metrics.jsonl')),
             TensorBoardWriter(workdir)]
  if console:
    writers.append(ConsoleWriter())
  return MultiWriter(writers)
