"""`purax train` whose batch SPIKE_AT is scaled by 1e3 (a garbage batch), and
that kills itself (SIGKILL) after KILL_AFTER calls (0: never).

Usage: python -m tests.scripts.spike_rollback_train SPIKE_AT KILL_AFTER purax-train-args...
"""

import os
import signal
import sys

import purax
from purax.app import cli, runs

spike_at, kill_after = int(sys.argv[1]), int(sys.argv[2])
argv = sys.argv[3:]
real_fit = runs.fit


class Spiked:
  def __init__(self, ds):
    self.ds = ds

  def __len__(self):
    return len(self.ds)

  def __getitem__(self, step):
    batch = self.ds[step]
    return dict(batch, x=batch['x'] * 1e3) if step == spike_at else batch


def fit(task, state, train_data, **kwargs):
  calls = [0]
  (hook,) = [h for h in kwargs['hooks'] if isinstance(h, purax.hooks.Stop)]
  poll = hook.poll

  def stop():                 # polled after every call
    calls[0] += 1
    if kill_after and calls[0] >= kill_after:
      for h in kwargs['hooks']:       # the saves started so far committed, then killed
        if isinstance(h, purax.hooks.Checkpoint):
          h.checkpointer.wait()
      os.kill(os.getpid(), signal.SIGKILL)
    return poll()

  hook.poll = stop
  return real_fit(task, state, Spiked(train_data), **kwargs)


runs.fit = fit
sys.exit(cli.main(argv))
