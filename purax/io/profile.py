"""A ``jax.profiler`` trace of chosen training steps, and device memory profiles.

:class:`Profiler` starts ``jax.profiler.start_trace(logdir)`` before the update
that runs at ``state.step == start`` and stops the trace after the update at
``stop - 1`` (Python's range: ``--profile 5:8`` traces the updates from
``state.step`` 5, 6 and 7), waiting for the device first, so the last step's
kernels are in the trace. Each traced step is a
``jax.profiler.StepTraceAnnotation('train', step_num=s)``, which TensorBoard's
profile plugin (xprof) uses for its step-time view.

The files land in ``logdir/plugins/profile/<time>/``: ``<host>.xplane.pb``
(TensorBoard / xprof: ``tensorboard --logdir runs`` with
``pip install tensorboard-plugin-profile``, or ``xprof --logdir runs``) and
``perfetto_trace.json.gz`` (open it at https://ui.perfetto.dev).

Example: in a host loop of your own (``fit`` has :class:`purax.hooks.Profile`):

  >>> from purax.io.profile import Profiler
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
  >>> state = task.init(jax.random.key(0), batch)
  >>> train_step = jax.jit(task.step)
  >>> profiler = Profiler('runs/prof', start=1, stop=2, perfetto=False)
  >>> for s in range(3):
  ...   with profiler.step(s):                  # s: state.step before the update
  ...     state, metrics = train_step(state, batches[s])
  >>> profiler.close(state)                     # stops a trace still open (early end)

``fit`` traces with :class:`purax.hooks.Profile` (``purax train --profile``),
which runs the traced updates one per call.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Iterator

import jax

from purax.core.errors import ConfigError, expect
from purax.io import safe_files

#: Name of the step annotations in the trace.
STEP_NAME = 'train'
#: File name of a device memory profile (pprof format; ``pprof -http=: FILE``).
MEMORY_PROFILE = 'memory.prof'


def parse_range(text: str) -> tuple[int, int]:
  """``'START:STOP'`` -> ``(start, stop)`` with ``0 <= start < stop``.

  Raises:
    ConfigError: naming ``profile``, the expected form and the value given.
  """
  parts = text.split(':') if isinstance(text, str) else []
  ok = len(parts) == 2 and all(p.strip().isdigit() for p in parts)
  expect(ok, 'profile', "'START:STOP' with integers 0 <= START < STOP (steps to trace)",
         repr(text), ConfigError)
  start, stop = int(parts[0]), int(parts[1])
  expect(start < stop, 'profile', 'START < STOP (an empty range traces nothing)',
         repr(text), ConfigError)
  return start, stop


class Profiler:
  """Traces the updates ``start <= state.step < stop`` into ``logdir``.

  Args:
    logdir: directory of the trace (a run directory: TensorBoard finds the
      profile next to the scalars).
    start: ``state.step`` of the first traced update.
    stop: ``state.step`` after the last traced update (exclusive end).
    memory_profile: also write ``logdir/memory.prof`` (device memory, pprof)
      when the trace stops.
    perfetto: also write ``perfetto_trace.json.gz`` next to the xplane file.

  Raises:
    ConfigError: ``start``/``stop`` not ``0 <= start < stop``.
  """

  def __init__(self, logdir: str, start: int, stop: int, *, memory_profile: bool = False,
               perfetto: bool = True):
    expect(0 <= start < stop, 'profile', '0 <= START < STOP', f'{start}:{stop}', ConfigError)
    self.logdir, self.start, self.stop = os.fspath(logdir), int(start), int(stop)
    self.memory_profile, self.perfetto = memory_profile, perfetto
    self.active = self.done = False

  def begin(self) -> None:
    os.makedirs(self.logdir, exist_ok=True)
    jax.profiler.start_trace(self.logdir, create_perfetto_trace=self.perfetto)
    self.active = True

  def end(self, block: Any = None) -> None:
    if block is not None:
      jax.block_until_ready(block)   # the traced steps' device work ends inside the trace
    jax.profiler.stop_trace()
    self.active, self.done = False, True
    if self.memory_profile:
      save_memory_profile(os.path.join(self.logdir, MEMORY_PROFILE))
    print(f'purax: profile of steps [{self.start}, {self.stop}) written to {self.logdir}',
          file=sys.stderr)

  @contextlib.contextmanager
  def step(self, step: int, block: Callable[[], Any] | None = None) -> Iterator[None]:
    """Around the update that starts at ``state.step == step``.

    Args:
      step: ``state.step`` before the update (a Python int).
      block: called after the last traced update; returns arrays to wait for
        (e.g. ``lambda: state``), so their computation is inside the trace.
    """
    if not self.done and not self.active and self.start <= step < self.stop:
      self.begin()
    if not self.active:
      yield
      return
    with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=step):
      yield
    if step + 1 >= self.stop:
      self.end(block() if block is not None else None)

  def close(self, block: Any = None) -> None:
    """Ends an open trace (a run that stopped early); idempotent."""
    if self.active:
      self.end(block)


def save_memory_profile(path: str) -> str:
  """Writes the devices' current memory profile (pprof) to ``path``; returns it.

  View with ``pprof --web PATH`` (or ``go tool pprof``); it lists the live
  buffers by the Python frame that allocated them. A symlink or non-regular
  file at ``path`` is refused (ConfigError, named), never written through.
  """
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  profile = jax.profiler.device_memory_profile()
  with safe_files.open_file(path, 'wb') as f:
    f.write(profile)
  return path


def is_out_of_memory(error: BaseException) -> bool:
  """Whether ``error`` is XLA's out-of-memory: status ``RESOURCE_EXHAUSTED``, or
  an "Out of memory" under another status (the CPU's ``INTERNAL: Error
  dispatching computation: Out of memory allocating N bytes`` when the failed
  step is read later)."""
  return isinstance(error, jax.errors.JaxRuntimeError) and (
      'RESOURCE_EXHAUSTED' in str(error) or 'out of memory' in str(error).lower())


@contextlib.contextmanager
def memory_profile_on_oom(logdir: str) -> Iterator[None]:
  """Writes ``logdir/memory.prof`` when the body fails with out of memory, then re-raises."""
  try:
    yield
  except BaseException as e:
    if is_out_of_memory(e):
      path = save_memory_profile(os.path.join(logdir, MEMORY_PROFILE))
      print(f'purax: out of memory; device memory profile written to {path}', file=sys.stderr)
    raise
