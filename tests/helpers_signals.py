"""Shared by the signal tests (tests/faults) and the commands' own resume
tests (tests/app): ``purax`` sending itself signals, the status it printed,
the runs the read-only commands read, and the small commands they run."""

import os
import re
import subprocess
import sys

import numpy as np

from purax.app import cli
from tests.helpers_runs import ENV, ROOT

CRASH = ('Traceback', 'Segmentation', 'Exception ignored', 'core dumped', 'Fatal Python')


def signal_at(moment, signals, *args, timeout=240):
  """``purax ARGS`` (its own command line) sending itself ``signals`` at ``moment``."""
  return subprocess.run([sys.executable, '-m', 'tests.scripts.signal_at', moment, signals,
                         *map(str, args)], cwd=ROOT, env=ENV, capture_output=True, text=True,
                        timeout=timeout)


def printed_status(done):
  """The exit status the command printed (None: none printed), checked to be
  said at most once and to be the status it exited with; no crash."""
  err = done.stderr
  assert not [c for c in CRASH if c in err], err[-3000:]
  assert done.returncode >= 0, (done.returncode, err[-3000:])   # not killed by a signal
  said = [int(s) for s in re.findall(r'exit status (\d+)', err)]
  assert len(said) <= 1, err[-3000:]
  if said:
    assert done.returncode == said[0], err[-3000:]
    return said[0]
  assert done.returncode == 0, err[-3000:]
  return None


def make_runs(d):
  """The runs of :func:`runs` in directory ``d`` (a ``pathlib.Path``)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(32, 6)).astype(np.float32)
  x[5, :] = 3e38          # the first layer overflows: step 2 is skipped and saved
  np.savez(d / 'd.npz', x_train=x, y_train=rng.integers(0, 3, 32),
           x_test=rng.normal(size=(8, 6)).astype(np.float32), y_test=rng.integers(0, 3, 8))
  assert cli.main(['train', '--dataset', f'npz:{d / "d.npz"}', '--model', 'mlp', '--steps', '4',
                   '--batch-size', '8', '--log-every', '2', '--eval-every', '0', '--no-progress',
                   '--debug-nans', '--workdir', str(d / 'run')]) == 0
  with open(os.path.join(ROOT, 'purax', 'core', 'errors.py'), encoding='utf-8') as f:
    (d / 'corpus.txt').write_text(f.read())
  assert cli.main(['train', '--model', 'lm', '--d-model', '16', '--num-layers', '1',
                   '--num-heads', '2', '--seq-len', '16', '--batch-size', '8',
                   '--warmup-steps', '0', '--dataset', f'text:{d / "corpus.txt"}', '--steps', '2',
                   '--log-every', '1', '--eval-every', '0', '--no-progress',
                   '--workdir', str(d / 'lm')]) == 0
  return d


TINY = ['--model', 'mlp', '--dataset', 'digits', '--batch-size', '16', '--no-progress']
SWEEP = ['sweep', *TINY, '--lr', '1e-3,3e-3', '--steps', '6', '--log-every', '2',
         '--eval-every', '0']
TUNE = ['tune', 'lr', '--model', 'mlp', '--dataset', 'digits', '--batch-size', '16',
        '--steps', '8', '--num-lrs', '3']
