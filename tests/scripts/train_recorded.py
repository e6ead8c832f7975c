"""`purax train` that records every batch it reads and can stop after k steps.

Usage: python -m tests.scripts.train_recorded STOP_AFTER_K purax-train-args...
(STOP_AFTER_K = 0: never). Each batch read is appended to WORKDIR/batches.txt as
`step sha1`, so two runs can be compared batch by batch.
"""

import hashlib
import os
import sys

import purax
from purax.app import cli, runs
from tests.helpers_runs import PerStep

stop_after = int(sys.argv[1])
argv = sys.argv[2:]
workdir = argv[argv.index('--workdir') + 1]
real_fit = runs.fit


def recorded(step, batch):
  digest = hashlib.sha1(batch['x'].tobytes() + batch['y'].tobytes()).hexdigest()
  with open(os.path.join(workdir, 'batches.txt'), 'a') as f:
    f.write(f'{step} {digest}\n')
  return batch


def fit(task, state, train_data, **kwargs):
  calls = [0]
  (hook,) = [h for h in kwargs['hooks'] if isinstance(h, purax.hooks.Stop)]
  poll = hook.poll

  def stop():                 # polled after every call, as the run's own flag is
    calls[0] += 1
    return poll() or (stop_after > 0 and calls[0] >= stop_after)

  hook.poll = stop
  return real_fit(task, state, PerStep(train_data, recorded), **kwargs)


runs.fit = fit
sys.exit(cli.main(argv))
