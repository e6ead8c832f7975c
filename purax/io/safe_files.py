"""Files in a run directory, opened without following a link out of it.

The run directory itself may be a symlink (the user's choice); what is
inside it is purax's. purax opens each of its own files there
(:func:`open_file`: the lock, ``metrics.jsonl``, ``config.json``, memory
profiles) with ``O_NOFOLLOW`` and refuses a symlink, a FIFO or any other
non-regular file at that name, naming it; an atomic write
(:func:`write_atomic`) goes through a fresh temporary (``O_EXCL``) and a
rename, which replaces a link at the name instead of writing through it. The
files that libraries write or read there (orbax's checkpoints, TensorBoard's
events, the profiler's traces, W&B, exports) are guarded once, when the run
directory is opened: :func:`check_no_links_out` refuses a symlink anywhere
under it that leads outside it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from purax.core.errors import ConfigError

_FLAGS = {'r': os.O_RDONLY, 'w': os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
          'a': os.O_WRONLY | os.O_CREAT | os.O_APPEND, 'x': os.O_WRONLY | os.O_CREAT | os.O_EXCL,
          'r+': os.O_RDWR | os.O_CREAT}


def _what(path: str) -> str:
  try:
    mode = os.lstat(path).st_mode
  except OSError:
    return 'a name that cannot be examined'
  if stat.S_ISLNK(mode):
    return f'a symlink to {os.readlink(path)!r}'
  return 'a directory' if stat.S_ISDIR(mode) else 'a FIFO, socket or device'


def _refused(path: str) -> ConfigError:
  return ConfigError(f'{path}: expected a regular file (purax never writes or reads a run '
                     f'directory\'s files through a link), got {_what(path)}; remove it')


def open_fd(path: str, mode: str = 'r') -> int:
  """``os.open(path)`` for ``mode`` (``'r'``, ``'w'``, ``'a'``, ``'x'``: new
  only, ``'r+'``: read and write, created if missing), refusing anything but a
  regular file at ``path`` itself (``O_NOFOLLOW``; ``O_NONBLOCK``, so a FIFO
  cannot block the open).

  Raises:
    ConfigError: ``path`` is a symlink (even a dangling one), a directory, a
      FIFO, a socket or a device, or (``'x'``) exists; naming it and what it is.
  """
  try:
    fd = os.open(path, _FLAGS[mode] | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
  except OSError as e:
    if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EEXIST):
      raise _refused(path) from e
    raise
  if not stat.S_ISREG(os.fstat(fd).st_mode):
    os.close(fd)
    raise _refused(path)
  return fd


def open_file(path: str, mode: str = 'r', **kwargs):
  """``open(path, mode, **kwargs)`` through :func:`open_fd` (``mode``: ``'r'``,
  ``'w'``, ``'a'`` or ``'x'``, with ``'b'`` for bytes)."""
  fd = open_fd(path, mode.replace('b', ''))
  try:
    return os.fdopen(fd, mode.replace('x', 'w'), **kwargs)
  except BaseException:
    os.close(fd)
    raise


def write_atomic(path: str, data: str | bytes) -> None:
  """Writes ``data`` to ``path`` through ``path + '.tmp'`` and a rename: a
  leftover temporary (or a link there) is removed first, never written
  through; a link at ``path`` is replaced, its target left unchanged."""
  tmp = path + '.tmp'
  with contextlib.suppress(FileNotFoundError):
    os.unlink(tmp)
  try:
    with open_file(tmp, 'x' if isinstance(data, str) else 'xb') as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:    # a failure or a signal's exit: no temporary left behind
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def check_no_links_out(root: str) -> None:
  """Refuses a symlink anywhere under ``root`` that leads outside it (what a
  library writes or reads through it would be another directory's); links
  within ``root``, and ``root`` itself being a link, are allowed.

  Raises:
    ConfigError: naming the first such link and where it leads.
  """
  real_root = os.path.realpath(root)
  for directory, dirs, files in os.walk(root):   # does not descend into linked directories
    for name in dirs + files:
      path = os.path.join(directory, name)
      if os.path.islink(path):
        target = os.path.realpath(path)
        if os.path.commonpath([real_root, target]) != real_root:
          raise ConfigError(
              f'{path}: expected a file or directory inside the run directory {root}, got a '
              f'symlink to {os.readlink(path)!r}, outside it (purax writes and reads nothing '
              'through it); remove it')
