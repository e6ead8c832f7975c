"""The directory of a ``purax sweep`` or ``purax tune lr``: locked, its config
recorded, resumed by the same command only.

Like a ``purax train`` run directory (:class:`purax.app.rundir.RunDir`): one
process at a time holds ``WORKDIR/.purax.lock``
(:class:`purax.app.rundir.WorkdirLock`); a new directory is created only
once the job is built (:meth:`JobDir.create`, which writes the config as
``WORKDIR/<kind>_config.json``); a failure or a stop before anything is
committed leaves the directory as it was found. An existing directory that
holds such a config is resumed when the config is the same (but for the
options that change no number: ``progress``), and refused, naming the first
field that differs, otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from purax.app.rundir import LOCK_NAME, LockedDirectory, WorkdirLock, leave_as_found
from purax.core.errors import ConfigError, expect
from purax.io import signals
from purax.io.safe_files import open_file, write_atomic

#: Options that change nothing a sweep or a range test computes or writes.
UNCHECKED = ('progress', 'workdir', 'checkpoint_every', 'time_budget', 'baseline')


class JobDir(LockedDirectory):
  """``with JobDir(workdir, 'sweep', config.flat()) as d:``: checks and locks
  ``workdir``; ``d.resuming`` says it holds this job to continue. ``kind``
  names the config file (``KIND_config.json``), ``what`` the job in messages,
  ``flat`` is the config (flat names: the command line's).

  Raises:
    FileExistsError: ``workdir`` is a file, or a directory that holds
      anything but this kind of job (a ``purax train`` run, other files).
    ConfigError: another process holds it; its recorded config differs
      (naming the first field); it cannot be created.
  """

  def __init__(self, workdir: str, kind: str, flat: dict, *, what: str | None = None):
    self.path, self.kind, self.flat = workdir, what or kind, dict(flat)
    self.config_name = f'{kind}_config.json'
    self._lock, self._created, self._keep = None, False, False
    self._found = os.path.exists(workdir)
    expect(not self._found or os.path.isdir(workdir), 'workdir',
           f'a directory (new, empty, or a purax {kind} to resume)',
           f'{workdir!r}, an existing file', FileExistsError)
    try:
      self.resuming = self._check() if self._found else False
    except BaseException:
      self.close(failed=False)
      raise

  def _check(self) -> bool:
    names = set(os.listdir(self.path)) - {LOCK_NAME}
    resuming = self.config_name in names
    expect(resuming or not names, 'workdir',
           f'a new or empty directory, or a purax {self.kind} directory to resume (with '
           f'{self.config_name})', f'{self.path!r}, which holds {sorted(names)[:5]}',
           FileExistsError)
    if self._lock is None:
      self._lock = WorkdirLock(self.path)
    if resuming:
      with open_file(self.file(self.config_name), encoding='utf-8') as f:
        saved = json.load(f)
      for field in sorted(set(saved) | set(self.flat)):
        if field in UNCHECKED:
          continue
        expect(saved.get(field) == _jsonable(self.flat.get(field)), field,
               f'{saved.get(field)!r}, the value this {self.kind} in {self.path} was started '
               f'with (run the same command to resume it, or choose another --workdir)',
               repr(_jsonable(self.flat.get(field))), ConfigError)
    return resuming

  def create(self) -> None:
    """Creates (when new) and locks the directory and records the config; a
    no-op when resuming."""
    if self.resuming:
      return
    try:
      os.makedirs(self.path, exist_ok=True)
    except OSError as e:
      raise ConfigError(f'workdir: expected a directory that can be created, got '
                        f'{self.path!r} ({e.strerror})') from e
    self._created = True
    self._check()
    write_atomic(self.file(self.config_name),
                 json.dumps({k: _jsonable(v) for k, v in self.flat.items()}, indent=1,
                            sort_keys=True))

  def committed(self) -> None:
    """Something resumable is committed: the directory is kept whatever happens."""
    self._keep = True

  def close(self, *, failed: bool) -> None:
    """Releases the lock; after a failure of a new job with nothing
    committed, leaves the directory as it was found."""
    try:
      if failed and self._created and not self._keep:
        leave_as_found(self.path, self._found)
    finally:
      if self._lock is not None:
        self._lock.release()
        self._lock = None


def _jsonable(value):
  """``value`` as JSON reads it back (tuples as lists)."""
  return json.loads(json.dumps(value))


def finished(summary: dict, stop, what: str) -> dict:
  """A finished sweep's or range test's ``summary``; a signal that arrived as
  it finished (``stop``: its :class:`purax.io.signals.StopOnSignal`) is said,
  with ``what`` was written, and kept as ``'stopped_by'``, which the command
  answers with the signal's exit status."""
  if not stop():
    return summary
  print(f'purax: {stop.received} arrived as the {what} is written '
        f'(exit status {signals.status(signal.Signals[stop.received])})', file=sys.stderr)
  return {**summary, 'stopped_by': stop.received}
