"""`purax train` whose batch SPIKE_AT is scaled by 1e3 (a garbage batch), and
that kills itself (SIGKILL) after the first call that reaches KILL_AT (0: never),
once the checkpoints started so far are committed.

Usage: python -m tests.scripts.spike_rollback_train SPIKE_AT KILL_AT purax-train-args...
"""

import os
import signal
import sys

import purax
from purax.app import cli, runs
from tests.helpers_runs import PerStep

spike_at, kill_at = int(sys.argv[1]), int(sys.argv[2])
argv = sys.argv[3:]
real_fit = runs.fit


def spiked(step, batch):
  return dict(batch, x=batch['x'] * 1e3) if step == spike_at else batch


class KillAt:
  """After the checkpoint of a step (order 25), SIGKILL once ``step >= kill_at``."""

  order, every, name = 25, None, 'kill_at'

  def __init__(self, checkpointer):
    self.checkpointer = checkpointer

  def __call__(self, info):
    if info.end is None and info.step >= kill_at > 0:
      self.checkpointer.wait()
      os.kill(os.getpid(), signal.SIGKILL)


def fit(task, state, train_data, **kwargs):
  (checkpoint,) = [h for h in kwargs['hooks'] if isinstance(h, purax.hooks.Checkpoint)]
  kwargs['hooks'] = list(kwargs['hooks']) + [KillAt(checkpoint.checkpointer)]
  return real_fit(task, state, PerStep(train_data, spiked), **kwargs)


runs.fit = fit
sys.exit(cli.main(argv))
