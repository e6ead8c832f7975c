"""SIGTERM and SIGINT: a first one is recorded and answered where the command
polls (a safe point between phases or steps), a second one exits ``128 + N`` at once.

Every ``purax`` command answers them the same way (:func:`exit_on_signals`,
installed by :func:`purax.app.cli.main`):

- the handler of a first signal only records it (:func:`received`): nothing
  is raised in the middle of jax/XLA work, of a file write or of a garbage
  collector callback. The command polls at its safe points (:func:`check`,
  or :class:`StopOnSignal` in a training loop) and ends through its normal
  return path: :class:`Stopped` (exit ``128 + N``, nothing half-written) or,
  where a checkpoint can be committed (``train``, ``sweep``, ``tune lr``),
  a stop after that commit (exit 0);
- a second signal raises ``SystemExit(128 + N)`` from the handler ("at
  once", unwinding the cleanups: temporaries removed, a new directory with
  nothing committed removed). Python swallows an exception raised inside a
  garbage-collector callback (jax's ``_xla_gc_callback``) or a ``__del__``:
  it is recorded first and raised again at the next poll
  (:func:`raise_pending`), so it is never lost. Inside :func:`deferred` (a
  short commit: the renames that publish an output) it waits for the end of
  the block.

Nothing is printed by the handler: the command says how it ended once, where
it ends, with the status it exits with.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: The signals a run answers, by name (``'SIGTERM'``).
NAMES = {s.name: s for s in SIGNALS}
_received: list[int] = []    # signals received inside exit_on_signals, in order
_pending: list[int] = []     # exits raised by a second signal that have not ended the process
_state = {'active': 0, 'deferring': 0, 'answered': False, 'last_exit': None}


def status(signum: int) -> int:
  """The documented exit status of signal ``signum``: ``128 + N`` (SIGINT 130, SIGTERM 143)."""
  return 128 + int(signum)


def name(signum: int) -> str:
  return signal.Signals(signum).name


class Stopped(BaseException):
  """A first SIGTERM/SIGINT, answered at a poll (:func:`check`): the command
  stops there with nothing half-written; ``status`` is ``128 + N``.

  A ``BaseException`` (as ``KeyboardInterrupt``): an ``except Exception``
  on the way does not swallow it; cleanups (``finally``) run.
  """

  def __init__(self, signame: str, phase: str):
    self.signame, self.phase = signame, phase
    self.status = status(signal.Signals[signame])
    super().__init__(f'stopped by {signame} {phase}; nothing written')


def received() -> str | None:
  """The name of the first signal received in this command, or None."""
  return name(_received[0]) if _received else None


def record(signum: int) -> bool:
  """Records ``signum`` (inside :func:`exit_on_signals`); whether it is the first."""
  if not _state['active']:
    return True
  _received.append(int(signum))
  return len(_received) == 1


def on_signal(signum, frame) -> None:
  """The handler: records a first signal; raises ``SystemExit(128 + N)`` for a
  second one (recorded first: see :func:`raise_pending`)."""
  del frame
  if not record(signum):
    on_second(signum)


def on_second(signum: int) -> None:
  """A second signal: ``SystemExit(128 + N)`` now (after a :func:`deferred` block)."""
  _pending.append(int(signum))
  _state['last_exit'] = status(_pending[0])
  if not _state['deferring']:
    raise SystemExit(status(signum))


def answered() -> bool:
  """Whether a :class:`StopOnSignal` took charge of the signal received (the
  command says itself how it ended: stopped after a checkpoint, or finished)."""
  return _state['answered']


def last_exit() -> int | None:
  """The status of the exit a second signal raised in the last
  :func:`exit_on_signals` block (kept after it), or None."""
  return _state['last_exit']


def raise_pending() -> None:
  """Raises the exit of a second signal whose handler's exception was
  swallowed (or deferred).

  Raises:
    SystemExit: ``128 + N`` of the first such signal.
  """
  if _pending and not _state['deferring']:
    raise SystemExit(status(_pending[0]))


def check(phase: str) -> None:
  """A safe point: raises the exit of a second signal (:func:`raise_pending`),
  or :class:`Stopped` when a first one was received.

  Args:
    phase: where the command is, in words: ``'while loading the run'``.
  """
  raise_pending()
  if _received:
    raise Stopped(received(), phase)


@contextlib.contextmanager
def deferred():
  """A short commit (renames that publish an output) that a second signal
  does not cut in two: its exit is raised at the end of the block."""
  _state['deferring'] += 1
  try:
    yield
  finally:
    _state['deferring'] -= 1
  raise_pending()


def early() -> None:
  """Installs :func:`on_signal` for the rest of the process (``python -m
  purax``, before its imports, which take a second): a signal that arrives
  then is recorded, and answered by the command's first poll."""
  if threading.current_thread() is threading.main_thread():
    for s in SIGNALS:
      signal.signal(s, on_signal)
    _state['active'] += 1


@contextlib.contextmanager
def exit_on_signals():
  """Installs :func:`on_signal` for SIGTERM and SIGINT (main thread only) for
  the block, then restores the previous handlers and forgets the signals.

  Python's report of a swallowed exit ("Exception ignored in ...", with its
  traceback) is left out: the exit is not lost but pending.
  """
  previous, unraisable = {}, sys.unraisablehook
  if threading.current_thread() is threading.main_thread():
    for s in SIGNALS:
      previous[s] = signal.signal(s, on_signal)

  def hook(report):
    if not (isinstance(report.exc_value, SystemExit) and _pending
            and report.exc_value.code == status(_pending[-1])):
      unraisable(report)
  sys.unraisablehook = hook
  _state['active'] += 1
  _state.update(answered=False, last_exit=None)
  try:
    yield
  finally:
    _state['active'] -= 1
    for s, handler in previous.items():
      signal.signal(s, handler)
    sys.unraisablehook = unraisable
    _received.clear()
    _pending.clear()


class StopOnSignal(contextlib.AbstractContextManager):
  """Turns SIGTERM/SIGINT into a flag polled by the loop; a second signal acts as usual.

  Use as ``with StopOnSignal() as stop: fit(..., hooks=standard(should_stop=stop))``: the
  loop then finishes its step, checkpoints and returns; ``stop.received``
  names the signal. Handlers are installed only on the main thread. Polling
  (``stop()``) first raises the exit of a second signal whose handler's
  exception Python swallowed (:func:`raise_pending`); under
  :func:`exit_on_signals` it also sees a first signal that arrived before
  the block (:func:`received`).
  """

  def __init__(self, signals=SIGNALS):
    self.signals, self.received, self._previous = signals, None, {}

  def __call__(self) -> bool:
    raise_pending()
    if self.received is None and _received:
      self.received = name(_received[0])
    if self.received is not None:
      _state['answered'] = True
    return self.received is not None

  def _handle(self, signum, frame):
    first = record(signum)
    self.received = self.received or name(signum)
    _state['answered'] = True
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    if not first:          # one came before the block (exit_on_signals recorded it)
      on_second(signum)

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for s in self.signals:
        self._previous[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    return False
