"""Checkpoint cost: training throughput with periodic async checkpoints vs none,
and (with ``--big``) save / restore time of a ~100M-parameter state.

1. Throughput of the default job (``purax train``'s defaults: CNN on digits,
   batch 64, 500 steps, log every 50, no evaluation here) with checkpoints
   against none, interleaved trials, median steps/s (the time includes waiting
   for the last commit):

   - ``default``: ``Checkpointer(directory)`` as it comes (a save when 300 s
     of wall clock have passed, checked at log points) and
     ``checkpoint_every=0``: in a job shorter than the interval, the final
     save only;
   - ``interval_Ts`` for each T in ``--intervals``: the wall-clock cadence at
     T seconds;
   - ``every_N`` for each N in ``--every``: the explicit cadence
     (``checkpoint_every=N``, no interval).

   Target: <= 5% slower at the default. Each save has a fixed cost (orbax's
   synchronous phase, the fingerprints, the background commit sharing the
   CPU), so the slowdown is about that cost over the training time between
   saves; the JSON gives both.
2. Size, only with ``--big`` (it needs ~4 GB of memory and ~1 minute): an
   MLP with ~100M float32 params (``--width``) and its AdamW state (~1.2 GB in
   all): the time ``save`` blocks the loop (device-to-host copy), the time to
   commit, and the time to restore onto the device.

Writes JSON (default ``benchmarks/results/checkpoint.json``); asserts nothing.
Usage: ``python benchmarks/checkpoint.py [--steps 500] [--every 100,250] [--intervals 1,5] [--trials 3] [--big]``
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import shutil
import statistics
import tempfile
import time

import jax
import numpy as np

import purax
from purax.io import datasets, pipeline
from purax.io.checkpoint import DEFAULT_INTERVAL_S, Checkpointer
from jsonout import write_json  # noqa: E402  (beside this script)


def throughput(task, data, *, every, directory, interval_s='default'):
  state = task.init(jax.random.key(0), data[0])
  ckpt = None
  if directory is not None:
    kwargs = {} if interval_s == 'default' else {'interval_s': interval_s}
    ckpt = Checkpointer(directory, keep_last=100, **kwargs)   # all kept: counted below
  blocked = [0.0]
  if ckpt is not None:   # time the loop spends inside save() and the final wait()
    for name in ('save', 'wait'):
      method = getattr(ckpt, name)

      def timed(*a, _method=method, **k):
        t = time.perf_counter()
        try:
          return _method(*a, **k)
        finally:
          blocked[0] += time.perf_counter() - t
      setattr(ckpt, name, timed)
  start = time.perf_counter()
  state, _ = purax.fit(task, state, data, hooks=purax.hooks.standard(log_every=50, progress=False, checkpointer=ckpt, checkpoint_every=every))
  jax.block_until_ready(state.params)
  elapsed = time.perf_counter() - start   # includes waiting for the last commit
  if ckpt is not None:
    ckpt.close()
  return len(data) / elapsed, blocked[0] / elapsed, blocked[0]


def big_state(width: int):
  model = purax.nn.MLP(num_classes=10, features=(width, width))
  task = purax.Task(model=model, tx=purax.adamw(total_steps=10))
  batch = {'x': np.zeros((2, 64), np.float32), 'y': np.zeros((2,), np.int32)}
  state = jax.jit(task.init)(jax.random.key(0), batch)
  return task, batch, state


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=500)
  parser.add_argument('--every', default='100,250')
  parser.add_argument('--intervals', default='1,5',
                      help='wall-clock cadences (seconds) to time beside the default')
  parser.add_argument('--trials', type=int, default=3)
  parser.add_argument('--big', action='store_true',
                      help='also time save/restore of a ~100M-parameter state (~4 GB RAM)')
  parser.add_argument('--width', type=int, default=9960,
                      help='MLP width of --big (9960: ~100M params)')
  parser.add_argument('--dir', default=None, help='scratch directory (default: a temp dir)')
  parser.add_argument('--out', default='benchmarks/results/checkpoint.json')
  args = parser.parse_args()
  scratch = args.dir or tempfile.mkdtemp(prefix='purax-ckpt-bench-')
  results = {'platform': jax.devices()[0].platform, 'cpu_count': os.cpu_count(),
             'python': platform.python_version(), 'jax': jax.__version__}

  ds = datasets.load('digits')
  task = purax.Task(model=purax.nn.CNN(num_classes=10),
                    tx=purax.adamw(learning_rate=2e-3, total_steps=args.steps, warmup_steps=50))
  data = pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=64, seed=0,
                                num_steps=args.steps)
  warm = pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=64, seed=0, num_steps=2)
  throughput(task, warm, every=0, directory=None)   # compile the step ...
  # ... and the save: a fresh process pays this once (the fingerprints' compilation)
  first_save_s = throughput(task, warm, every=0, directory=os.path.join(scratch, 'warm'))[2]
  everies = [int(e) for e in args.every.split(',') if e]
  intervals = [float(t) for t in args.intervals.split(',') if t]
  variants = {'none': dict(every=0, interval_s=None, directory=False),
              'default': dict(every=0, interval_s='default', directory=True),
              **{f'interval_{t:g}s': dict(every=0, interval_s=t, directory=True)
                 for t in intervals},
              **{f'every_{e}': dict(every=e, interval_s=None, directory=True) for e in everies}}
  runs = {name: [] for name in variants}
  saves = {name: [] for name in variants}
  blocked_fraction = {name: [] for name in variants}
  for trial in range(args.trials):   # interleaved, so drift hits every variant alike
    for name, v in variants.items():
      d = os.path.join(scratch, f'throughput-{trial}-{name}') if v['directory'] else None
      steps_per_sec, blocked, _ = throughput(task, data, every=v['every'], directory=d,
                                          interval_s=v['interval_s'])
      runs[name].append(steps_per_sec)
      blocked_fraction[name].append(blocked)
      if d is not None:
        saves[name].append(len(glob.glob(os.path.join(d, '[0-9]*'))))
        shutil.rmtree(d, ignore_errors=True)
  med = {k: statistics.median(v) for k, v in runs.items()}
  results['throughput'] = {
      'model': 'cnn', 'dataset': 'digits', 'batch_size': 64, 'steps': args.steps,
      'log_every': 50, 'default_interval_s': DEFAULT_INTERVAL_S,
      'first_save_in_process_blocked_s': first_save_s,
      'steps_per_sec_median': med, 'steps_per_sec_all': runs,
      'saves_per_run': saves,
      # The share of the run's time spent inside save() and the final wait():
      # a direct measure of the cost, less noisy under CPU contention than the
      # difference of two throughputs, but blind to the background commit
      # competing with the steps for the CPU (none for the final save, which
      # the run waits for).
      'blocked_fraction_median': {k: statistics.median(v) for k, v in
                                  blocked_fraction.items() if k != 'none'},
      'slowdown': {k: 1.0 - v / med['none'] for k, v in med.items() if k != 'none'},
      'training_seconds': args.steps / med['none'],
      'seconds_between_saves': {f'every_{e}': e / med['none'] for e in everies}}
  for name in variants:
    if name != 'none':
      print(f"{name}: {med[name]:.1f} vs {med['none']:.1f} steps/s, slowdown "
            f"{100 * results['throughput']['slowdown'][name]:.1f}%, blocked in save/wait "
            f"{100 * statistics.median(blocked_fraction[name]):.1f}% of the run")

  if args.big:
    results['size'] = big_checkpoint(args, scratch)
  if not args.dir:
    shutil.rmtree(scratch, ignore_errors=True)
  write_json(args.out, results)


def big_checkpoint(args, scratch) -> dict:
  """Save (blocking part, commit) and restore time of the --width MLP's state."""
  _, _, state = big_state(args.width)
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  n_bytes = sum(x.nbytes for x in jax.tree.leaves(state) if hasattr(x, 'nbytes'))
  directory = os.path.join(scratch, 'big')
  ckpt = Checkpointer(directory, keep_last=1)
  t0 = time.perf_counter()
  ckpt.save(1, {'state': state})
  t_block = time.perf_counter() - t0
  ckpt.wait()
  t_commit = time.perf_counter() - t0
  abstract = jax.eval_shape(lambda s: {'state': s}, state)
  del state
  t0 = time.perf_counter()
  restored, _, _ = ckpt.restore(abstract)
  jax.block_until_ready(restored)
  t_restore = time.perf_counter() - t0
  ckpt.close()
  disk = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(directory) for f in fs)
  print(f'{n_params / 1e6:.1f}M params, {n_bytes / 2**30:.2f} GiB state: save blocks '
        f'{t_block:.2f} s, commits in {t_commit:.2f} s, restore {t_restore:.2f} s')
  return {'params': int(n_params), 'state_bytes': int(n_bytes), 'disk_bytes': disk,
          'save_blocking_s': t_block, 'save_commit_s': t_commit, 'restore_s': t_restore}


if __name__ == '__main__':
  main()
