"""A run directory: lock, create or resume, write atomically, clean up.

One run at a time per directory: a run holds ``WORKDIR/.purax.lock`` (an
``flock``, released by the kernel when the process dies, so a stale lock is
taken over safely); a second run is refused at once, naming the holder.

:class:`RunDir` decides on process 0 and tells every process (multi-host):
is the directory new, empty, or a purax run to resume (then its saved config
must agree with this one)? A new directory is created only once everything
else is built and checked (:meth:`RunDir.create`); if the run then fails
before any checkpoint is committed, :meth:`RunDir.close` leaves the
directory as it was found. Its files are opened through
:mod:`purax.io.safe_files`: never through a link out of the directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from purax.app.config import CONFIG as CONFIG
from purax.app.config import TrainConfig
from purax.app.config import read_config as read_config
from purax.core.errors import ConfigError, expect
from purax.io.safe_files import open_fd, open_file, write_atomic

LOCK_NAME = '.purax.lock'


class WorkdirLock:
  """An exclusive ``flock`` on ``WORKDIR/.purax.lock`` holding ``{pid, host, since}``.

  The kernel releases it when the holder exits or dies (even by SIGKILL), so
  a lock file left by a dead run is simply taken over; the file is never
  deleted (deleting a lock file races with a process about to lock it).

  Raises:
    ConfigError: another live process holds it (named: pid, host, since), or
      it is not a regular file (a symlink, named with its target: never
      written through).
  """

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK_NAME)
    fd = open_fd(self.path, 'r+')
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      try:
        holder = json.loads(os.pread(fd, 4096, 0) or b'{}')
      except ValueError:
        holder = {}
      os.close(fd)
      raise ConfigError(
          f'workdir: expected no other run using {workdir}, got one: process '
          f'{holder.get("pid", "?")} on host {holder.get("host", "?")} holds {self.path} '
          f'(since {holder.get("since", "?")}); wait for it to end or stop it') from e
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({'pid': os.getpid(), 'host': socket.gethostname(),
                              'since': time.strftime('%Y-%m-%dT%H:%M:%S%z')}).encode(), 0)
    self._fd = fd

  def release(self) -> None:
    if self._fd is not None:
      os.close(self._fd)   # releases the flock
      self._fd = None


def holds_run(workdir: str) -> bool:
  """Whether ``workdir`` holds a purax run to resume (its ``config.json``);
  False when it is new or empty (a lock file aside). Reads only.

  Raises:
    FileExistsError: ``workdir`` holds anything else (not a purax run).
  """
  resuming = os.path.isfile(os.path.join(workdir, CONFIG))
  if not resuming:
    expect(not os.path.exists(workdir) or not set(os.listdir(workdir)) - {LOCK_NAME},
           'workdir', 'a new or empty directory, or a purax run directory to resume',
           repr(workdir), FileExistsError)
  return resuming


def leave_as_found(path: str, found: bool) -> None:
  """A directory as it was before a run (or a sweep, a range test) that failed
  with nothing committed: removed when it did not exist, else emptied (its
  lock file too: it was empty; a link is removed, not followed)."""
  if not found:
    shutil.rmtree(path, ignore_errors=True)
    return
  for name in os.listdir(path):
    entry = os.path.join(path, name)
    if os.path.isdir(entry) and not os.path.islink(entry):
      shutil.rmtree(entry, ignore_errors=True)
    else:
      with contextlib.suppress(OSError):
        os.remove(entry)


def truncate_jsonl(path: str, last_step: int, rollbacks: int = 0) -> None:
  """Drops records written after ``last_step`` (they are recomputed on resume).

  ``rollbacks``: the spike rollbacks (:class:`purax.hooks.SpikeRollback`) the
  resumed checkpoint had made, whose steps went back: everything up to the
  record of the last of them is kept, and after it the records up to the
  first past ``last_step``.
  """
  if not os.path.exists(path):
    return
  with open_file(path) as f:
    lines = [line for line in f if line.strip()]
  keep = []
  if rollbacks:
    for i, line in enumerate(lines):
      try:
        record = json.loads(line)
      except ValueError:
        continue        # a line torn by a kill
      if rollbacks > 0:
        rollbacks -= 'rollback/from_step' in record
        keep.append(line)
      elif record.get('step', last_step + 1) > last_step:
        break
      else:
        keep.append(line)
    write_atomic(path, ''.join(keep))
    return
  for line in lines:
    try:
      if json.loads(line)['step'] <= last_step:
        keep.append(line)
    except (ValueError, KeyError):
      pass   # a line torn by a kill
  write_atomic(path, ''.join(keep))


def decide_on_primary(decide) -> int:
  """``decide()`` on process 0, its int answer given to every process.

  So that all go on, or all fail, together: an exception on process 0 is
  raised there, and on the others as a ConfigError that points to its log.
  """
  error, answer = None, 0
  if jax.process_index() == 0:
    try:
      answer = int(decide())
    except Exception as e:   # any refusal: told to the other processes, then raised
      error = e
  if jax.process_count() > 1:
    got = int(multihost_utils.broadcast_one_to_all(
        np.int32(-1 if error is not None else answer)))
    expect(error is not None or got != -1, 'workdir',
           'a directory process 0 accepts (its log names what it refused)', 'a refusal',
           ConfigError)
    answer = got
  if error is not None:
    raise error
  return answer


class LockedDirectory:
  """What a run directory (:class:`RunDir`) and a sweep's or range test's
  (:class:`purax.app.jobdir.JobDir`) share: ``with`` closes it (``failed``
  when the block raised), and :meth:`file` names a file in it. A subclass
  sets ``path`` and defines ``close(*, failed)``."""

  path: str

  def close(self, *, failed: bool) -> None:
    raise NotImplementedError

  def __enter__(self):
    return self

  def __exit__(self, kind, error, tb) -> None:
    self.close(failed=kind is not None)

  def file(self, name: str) -> str:
    """The path of ``name`` in the directory."""
    return os.path.join(self.path, name)


class RunDir(LockedDirectory):
  """The directory of one run, from the first check to the last file.

  Its life in ``purax train``: ``with RunDir(config) as rundir:`` checks (and
  locks) an existing directory; the job is built with nothing written yet;
  ``rundir.create()`` writes ``config.json``, and from there a failure cleans
  up; ``rundir.committed()`` says a checkpoint exists: the directory is kept.

  Attributes:
    path: the directory.
    resuming: it holds a purax run that this one continues.
    primary: this process writes the files (process 0).
  """

  def __init__(self, config: TrainConfig):
    self.config = config
    self.path = config.run.workdir
    self.primary = jax.process_index() == 0
    self._lock = None
    self._found = os.path.exists(self.path)
    self._created = False
    self._keep = False
    # An existing directory is locked now: a second run on it stops here.
    try:
      self.resuming = bool(decide_on_primary(lambda: self._check(create=False)))
    except BaseException:
      self.close(failed=False)     # the lock is released; nothing was written
      raise

  def saved_config(self) -> TrainConfig | None:
    return read_config(self.path) if self.resuming else None

  def create(self) -> None:
    """Creates (if new) and locks a new run's directory and writes ``config.json``;
    a no-op when resuming."""
    if self.resuming:
      return
    decide_on_primary(lambda: self._check(create=True))
    self._created = True
    if self.primary:
      write_atomic(self.file(CONFIG), self.config.to_json())

  def update_config(self) -> None:
    """Records a resumed run's config (e.g. a larger ``steps``) in ``config.json``."""
    if self.primary and self.resuming:
      write_atomic(self.file(CONFIG), self.config.to_json())

  def replace_config(self, config: TrainConfig) -> None:
    """Records ``config``, changed by purax itself during the run (a memory
    refit, :func:`purax.app.runs.refit`), in ``config.json``; from here the
    directory is a run to resume (its next attempt restores the newest
    checkpoint, or starts at step 0 without one)."""
    self.config, self.resuming = config, True
    if self.primary:
      write_atomic(self.file(CONFIG), self.config.to_json())

  def committed(self) -> None:
    """A checkpoint is committed: the directory is kept whatever happens next."""
    self._keep = True

  def close(self, *, failed: bool) -> None:
    """Releases the lock; after a failure of a new run with nothing committed,
    leaves the directory as it was found."""
    try:
      if failed and self._created and not self._keep and self.primary:
        leave_as_found(self.path, self._found)
    finally:
      if self._lock is not None:
        self._lock.release()
        self._lock = None

  def _check(self, *, create: bool) -> bool:
    """Whether the directory holds a run to resume (checked against it).

    Locks the directory once it exists and is a purax run or empty; with
    ``create``, creates it first. Only process 0 calls this.

    Raises:
      FileExistsError: the directory is neither new, empty, nor a purax run;
      ConfigError: another run holds the directory; the saved run's config
        differs in a field that changes the computation; or the path cannot
        be written.
    """
    workdir = self.path
    expect(not os.path.exists(workdir) or os.path.isdir(workdir), 'workdir',
           'a directory (new, empty, or a purax run to resume)',
           f'{workdir!r}, an existing file', FileExistsError)
    # Unwritable paths are refused here, before data is loaded or anything compiled.
    ancestor = os.path.abspath(workdir)
    while not os.path.exists(ancestor):
      ancestor = os.path.dirname(ancestor)
    expect(os.path.isdir(ancestor) and os.access(ancestor, os.W_OK | os.X_OK), 'workdir',
           'a directory this process can write (or create)',
           f'{workdir!r} ({ancestor!r} is not writable)' if ancestor != os.path.abspath(workdir)
           else f'{workdir!r}, not writable', ConfigError)
    if create:
      try:
        os.makedirs(workdir, exist_ok=True)
      except OSError as e:
        raise ConfigError(f'workdir: expected a directory that can be created, got '
                          f'{workdir!r} ({e.strerror})') from e

    holds_run(workdir)             # refuse a foreign directory before writing a lock into it
    if self._lock is None and os.path.isdir(workdir):
      self._lock = WorkdirLock(workdir)
    resuming = holds_run(workdir)  # again under the lock: another run may have written
    expect(not (create and resuming), 'workdir',
           'still new or empty when this run was ready to start',
           f'{workdir!r}, where another run wrote meanwhile (run again to resume it)',
           ConfigError)
    if resuming:
      self.config.check_resumable(read_config(workdir))
    return resuming
