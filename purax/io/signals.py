"""SIGTERM and SIGINT: a first one stops a run at a point the loop chooses, a
second (or one outside a run) exits with ``128 + N``.

Python runs a signal handler in the main thread between two bytecodes,
wherever they are; an exception it raises inside a garbage-collector
callback (jax's ``_xla_gc_callback``) or a ``__del__`` is printed as
"Exception ignored" and lost. :func:`exit_on_signal` therefore records the
exit before raising it, and :func:`raise_pending` (called at every point
where a run polls, see :class:`StopOnSignal`) raises it again: a signal is
never swallowed, only answered at the next poll.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: The signals a run answers, by name (``'SIGTERM'``).
NAMES = {s.name: s for s in SIGNALS}
_pending: list[int] = []     # exits raised by exit_on_signal that have not ended the process


def status(signum: int) -> int:
  """The documented exit status of signal ``signum``: ``128 + N`` (SIGINT 130, SIGTERM 143)."""
  return 128 + int(signum)


def exit_on_signal(signum, frame) -> None:
  """A handler: says so on stderr and raises ``SystemExit(128 + N)``."""
  del frame
  _pending.append(int(signum))
  print(f'purax: stopped by {signal.Signals(signum).name} (exit status {status(signum)}); '
        'files are written atomically, so nothing is half-written', file=sys.stderr)
  raise SystemExit(status(signum))


def raise_pending() -> None:
  """Raises the exit of a signal whose handler's exception was swallowed.

  Raises:
    SystemExit: ``128 + N`` of the first such signal.
  """
  if _pending:
    raise SystemExit(status(_pending[0]))


@contextlib.contextmanager
def exit_on_signals():
  """Installs :func:`exit_on_signal` for SIGTERM and SIGINT (main thread only)
  for the block, then restores the previous handlers and forgets pending exits.

  Python's report of a swallowed exit ("Exception ignored in ...", with its
  traceback) is left out: the exit is not lost but pending (its message
  printed), so the report would only hide that message.
  """
  previous, unraisable = {}, sys.unraisablehook
  if threading.current_thread() is threading.main_thread():
    for s in SIGNALS:
      previous[s] = signal.signal(s, exit_on_signal)

  def hook(report):
    if not (isinstance(report.exc_value, SystemExit) and _pending
            and report.exc_value.code == status(_pending[-1])):
      unraisable(report)
  sys.unraisablehook = hook
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    sys.unraisablehook = unraisable
    _pending.clear()


class StopOnSignal(contextlib.AbstractContextManager):
  """Turns SIGTERM/SIGINT into a flag polled by the loop; a second signal acts as usual.

  Use as ``with StopOnSignal() as stop: fit(..., hooks=standard(should_stop=stop))``: the
  loop then finishes its step, checkpoints and returns; ``stop.received``
  names the signal. Handlers are installed only on the main thread. Polling
  (``stop()``) first re-raises an exit that a signal's handler raised where
  Python swallowed it (:func:`raise_pending`).
  """

  def __init__(self, signals=SIGNALS):
    self.signals, self.received, self._previous = signals, None, {}

  def __call__(self) -> bool:
    raise_pending()
    return self.received is not None

  def _handle(self, signum, frame):
    self.received = signal.Signals(signum).name
    for s, handler in self._previous.items():
      signal.signal(s, handler)

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for s in self.signals:
        self._previous[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    return False
