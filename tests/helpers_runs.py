"""Shared fixtures of the end-to-end runs: the default resumed run's arguments,
``purax`` in a fresh process, and readers of what a run leaves."""

import json
import os
import subprocess
import sys

import jax
import numpy as np

from purax.app import job as job_lib
from purax.app.rundir import read_config
from purax.io import writers
from purax.io.checkpoint import Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
ENV = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
ENV['XLA_FLAGS'] = os.environ.get('PURAX_TEST_CHILD_XLA_FLAGS', '')   # one device
ENV['PYTHONPATH'] = ROOT + os.pathsep + ENV.get('PYTHONPATH', '')
ARGS = ['--model', 'mlp', '--steps', '40', '--batch-size', '32', '--log-every', '10',
        '--eval-every', '20', '--checkpoint-every', '10', '--dropout-rate', '0.2',
        '--no-progress']


class PerStep:
  """A random-access data set whose batch of step ``s`` is ``fn(s, data[s])``:
  how the scripts under tests/scripts change or record what ``purax train``
  reads (``runs.fit`` patched to wrap its ``train_data``)."""

  def __init__(self, data, fn):
    self.data, self.fn = data, fn

  def __len__(self):
    return len(self.data)

  def __getitem__(self, step):
    return self.fn(step, self.data[step])


def purax(*args, recorded_stop=None, timeout=180, xla_flags=None):
  """``purax ARGS`` in a fresh process (``xla_flags``: instead of the suite's)."""
  if recorded_stop is None:
    cmd = [sys.executable, '-m', 'purax', *args]
  else:
    cmd = [sys.executable, '-m', 'tests.scripts.train_recorded', str(recorded_stop), *args]
  env = ENV if xla_flags is None else dict(ENV, XLA_FLAGS=xla_flags)
  return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def script(name, *args, timeout=300):
  """The last line ``tests/scripts/NAME`` prints, run in a fresh process (this
  checkout's purax, CPU, one device); its failure shows its stderr."""
  done = subprocess.run([sys.executable, os.path.join(ROOT, 'tests', 'scripts', name),
                         *map(str, args)], cwd=ROOT, env=dict(ENV, JAX_PLATFORMS='cpu'),
                        capture_output=True, text=True, timeout=timeout)
  assert done.returncode == 0, done.stderr[-2000:]
  return done.stdout.strip().splitlines()[-1]


def final_tree(workdir):
  abstract = job_lib.build(read_config(workdir).validate(), mesh=False).abstract
  with Checkpointer(os.path.join(workdir, 'checkpoints')) as ckpt:
    tree, extra, step = ckpt.restore(abstract)
  tree = jax.tree.map(lambda x: np.asarray(jax.random.key_data(x)) if jax.dtypes.issubdtype(
      x.dtype, jax.dtypes.prng_key) else np.asarray(x), tree)
  return tree, extra, step




def logged(workdir):
  out = []
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    for line in f:
      rec = json.loads(line)
      if 'status' not in rec:          # the run's end records: ends(workdir)
        out.append({k: v for k, v in rec.items() if k not in writers.TIMINGS})
  return out


def ends(workdir):
  """The end records of a run's ``metrics.jsonl`` (``{'step', 'status', 'end'}``)."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [{k: v for k, v in rec.items() if k != 'time'} for rec in map(json.loads, f)
            if 'status' in rec]


def batches(workdir):
  seen = {}
  with open(os.path.join(workdir, 'batches.txt')) as f:
    for line in f:
      step, digest = line.split()
      assert seen.setdefault(int(step), digest) == digest, f'step {step} got another batch'
  return seen
