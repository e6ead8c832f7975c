"""What a run shows while it trains: a progress bar where someone watches it,
and one plain line per log point through Python's ``logging``.

A tqdm bar redraws one line with carriage returns; written to a pipe or a
file (CI logs, ``make train > log``) its frames and the log lines run together
into one long line. :func:`bar` therefore draws tqdm's bar only when the
stream is a terminal (or a Jupyter kernel) and tqdm is installed (it is in
the ``cli`` extra, not the core); otherwise it returns :class:`NullBar`, and
the log points are the only output, one plain line each.

The log-point lines (``[step 50] train/loss=0.1234 ...``, written by
:class:`purax.io.writers.ConsoleWriter`) are records of the ``purax`` logger
(:data:`LOGGER`, level INFO unless you set another), so the ``logging``
module silences or routes them:

- not configured for them (a plain ``python script.py``, the ``purax``
  command, a notebook): each is printed as a plain line on ``sys.stdout``
  (through ``tqdm.write`` when tqdm is installed, so a live bar stays intact);
- ``logging.getLogger('purax').setLevel(logging.WARNING)``: none;
- a handler of your own on the ``purax`` logger, or a root logger set to
  INFO or below (``logging.basicConfig(level=logging.INFO, ...)``): they go
  there instead, formatted by it.

(The ``purax`` logger does not propagate by itself: absl, which orbax
imports, puts a stderr handler on the root logger, which would print every
line a second time. Its fallback handler forwards them to the root's
handlers when the root asks for INFO, and forwards its child loggers'
records, e.g. ``purax.checkpoint``, as propagation would.)

Example:
  >>> from purax.io import progress
  >>> bar = progress.bar(total=100, initial=0, enabled=False)   # enabled: draw when watched
  >>> bar.update(1); bar.set_postfix(loss='0.1234', refresh=False); bar.close()
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

#: The logger of the log-point lines (level INFO unless you set another).
LOGGER = logging.getLogger('purax')


class _Fallback(logging.Handler):
  """The ``purax`` logger's own handler (the module docstring): a log-point
  line as a plain stdout line unless logging is configured for it."""

  def emit(self, record: logging.LogRecord) -> None:
    try:
      root = logging.getLogger()
      ours = record.name == LOGGER.name
      if not LOGGER.propagate and (not ours or root.level <= record.levelno):
        for handler in root.handlers:      # what propagation to the root would do
          if record.levelno >= handler.level and handler not in LOGGER.handlers:
            handler.handle(record)         # (a handler on both is called once)
      if not ours or any(h is not self for h in LOGGER.handlers) or (
          root.handlers and (LOGGER.propagate or root.level <= record.levelno)):
        return                                       # routed: shown where it went
      write(record.getMessage(), sys.stdout)
    except Exception:   # pylint: disable=broad-except  # logging's rule: never raise
      self.handleError(record)


if not any(isinstance(h, _Fallback) for h in LOGGER.handlers):   # once per process
  LOGGER.addHandler(_Fallback())
  LOGGER.propagate = False
  if LOGGER.level == logging.NOTSET:
    LOGGER.setLevel(logging.INFO)


def log_line(line: str) -> None:
  """One log-point line, a record of :data:`LOGGER` at INFO (see the module docstring)."""
  LOGGER.info('%s', line)


def interactive(stream: TextIO | None = None) -> bool:
  """Whether ``stream`` (default ``sys.stderr``, where tqdm draws) is watched live:
  a terminal, or a Jupyter kernel's output (tqdm.auto draws a widget there)."""
  stream = sys.stderr if stream is None else stream
  isatty = getattr(stream, 'isatty', None)
  try:
    if isatty is not None and isatty():
      return True
  except ValueError:   # a closed stream
    return False
  return 'ipykernel' in sys.modules


class NullBar:
  """tqdm's interface, doing nothing (no terminal, no tqdm, or turned off)."""

  def update(self, n: int = 1) -> None:
    del n

  def set_postfix(self, *args: Any, **kwargs: Any) -> None:
    del args, kwargs

  def close(self) -> None:
    pass


def bar(total: int, initial: int = 0, *, enabled: bool = True, desc: str | None = None,
        stream: TextIO | None = None):
  """A tqdm progress bar of ``total`` steps, or a :class:`NullBar`.

  Args:
    total: steps of the whole run.
    initial: steps already done (a resumed run).
    enabled: ``False`` always gives a :class:`NullBar`.
    desc: a label before the bar.
    stream: where the bar draws (default ``sys.stderr``).

  Returns:
    A ``tqdm.auto.tqdm`` when ``enabled``, the stream is :func:`interactive`
    and tqdm is installed; otherwise a :class:`NullBar`.
  """
  if not enabled or not interactive(stream):
    return NullBar()
  try:
    from tqdm.auto import tqdm
  except ImportError:   # the core install has no tqdm: no bar, the log lines remain
    return NullBar()
  return tqdm(total=total, initial=initial, unit='step', dynamic_ncols=True, desc=desc,
              file=stream)


def write(line: str, stream: TextIO | None = None) -> None:
  """Prints ``line`` (a log point) without breaking a live bar; a plain print otherwise."""
  stream = sys.stdout if stream is None else stream
  try:
    from tqdm import tqdm
  except ImportError:   # no tqdm, so no bar to keep intact
    print(line, file=stream, flush=True)
    return
  tqdm.write(line, file=stream)
  stream.flush()
