"""Any `purax` command that sends itself signals at one named moment of its run.

Usage: python -m tests.scripts.signal_at MOMENT SIGNALS purax-args...

SIGNALS: one name (``SIGTERM``) or several, comma-separated, sent back to
back (``SIGTERM,SIGINT``: a second signal). The command runs as the
``purax`` console script does (``cli.main()`` on ``sys.argv``: its own
command line, so it ends with ``os._exit`` after a signal).

Moments:
  parse         as the command line is parsed (start-up, before jax is imported)
  build         as a job is built (data loading, the model traced)
  restore       as a checkpoint is restored
  step:N        before the N-th call of a population's train step (sweep, tune lr)
  evaluate      as an evaluation starts
  export        as the artifact is exported (traced, serialized, written)
  write         as the first file is written atomically (a plot, lr_range.json, ...)
  finish        as the command's function returns (its work done, its line not printed)
"""

import os
import signal
import sys

moment, names, argv = sys.argv[1], sys.argv[2].split(','), sys.argv[3:]

from purax.app import cli, commands, job as job_lib   # noqa: E402
from purax.plan import members                          # noqa: E402
from purax.io import export, safe_files                 # noqa: E402
from purax.io.checkpoint import Checkpointer           # noqa: E402
from purax import loop                                  # noqa: E402


def send():
  for name in names:
    os.kill(os.getpid(), signal.Signals[name])


def once(n=1):
  calls = [0]

  def when():
    calls[0] += 1
    return calls[0] == n
  return when


class Before:
  """``real`` (a function or a jitted one: its attributes kept) that sends first when due."""

  def __init__(self, real, when):
    self.real, self.when = real, when

  def __call__(self, *args, **kwargs):
    if self.when():
      send()
    return self.real(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self.real, name)

  def __get__(self, obj, kind=None):    # as a method
    return self if obj is None else (lambda *a, **k: self(obj, *a, **k))


def before(owner, name, n=1, when=None):
  setattr(owner, name, Before(getattr(owner, name), when or once(n)))


class After(Before):
  def __call__(self, *args, **kwargs):
    out = self.real(*args, **kwargs)
    if self.when():
      send()
    return out


kind, _, n = moment.partition(':')
if kind == 'parse':
  before(cli, 'parse')
elif kind == 'build':
  before(job_lib, 'build')
elif kind == 'restore':
  before(Checkpointer, 'restore')
elif kind == 'step':
  before(members, 'train_step', int(n))
elif kind == 'evaluate':
  before(loop, 'evaluate')
  from purax.app import runs
  before(runs, 'evaluate')
elif kind == 'export':
  before(export, 'export')
elif kind == 'write':
  from purax.app import plot, rundir, tune
  first = once()
  for module in (safe_files, rundir, tune, plot):
    before(module, 'write_atomic', when=first)
elif kind == 'finish':
  from purax.app import plot, runs, sweep, tune
  for module, name in ((runs, 'train'), (runs, 'evaluate_run'), (runs, 'export_run'),
                       (runs, 'generate_run'), (runs, 'debug_nan_run'), (plot, 'plot'),
                       (sweep, 'run'), (tune, 'run')):
    setattr(module, name, After(getattr(module, name), lambda: True))
else:
  raise SystemExit(f'unknown moment {moment!r}')
sys.argv = ['purax', *argv]
sys.exit(cli.main())
