"""A progress bar only where someone watches it.

A tqdm bar redraws one line with carriage returns; written to a pipe or a
file (CI logs, ``make train > log``) its frames and the log lines run together
into one long line. :func:`bar` therefore draws tqdm's bar only when the
stream is a terminal (or a Jupyter kernel) and tqdm is installed (it is in
the ``cli`` extra, not the core); otherwise it returns :class:`NullBar`, and
the log points are the only output, one plain line each.

Example:
  >>> from purax.io import progress
  >>> bar = progress.bar(total=100, initial=0, enabled=False)   # enabled: draw when watched
  >>> bar.update(1); bar.set_postfix(loss='0.1234', refresh=False); bar.close()
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


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
