"""Checkpoint cost: training throughput with periodic async checkpoints vs none,
and (with ``--big``) save / restore time of a ~100M-parameter state.

1. Throughput: ``purax.fit`` on digits (CNN, batch 64) for ``--steps`` steps,
   checkpointing every N steps (orbax, asynchronous) for each N in ``--every``
   against no checkpoints; interleaved trials, median steps/s. Target: <= 5%
   slower. Each save has a fixed cost (orbax's synchronous phase plus the
   background commit sharing the CPU), so the slowdown is about that cost over
   the training time between saves; the JSON gives both.
2. Size, only with ``--big`` (it needs ~4 GB of memory and ~1 minute): an
   MLP with ~100M float32 params (``--width``) and its AdamW state (~1.2 GB in
   all): the time ``save`` blocks the loop (device-to-host copy), the time to
   commit, and the time to restore onto the device.

Writes JSON (default ``benchmarks/results/checkpoint.json``); asserts nothing.
Usage: ``python benchmarks/checkpoint.py [--steps 400] [--every 25,50,100,200] [--trials 3] [--big]``
"""

from __future__ import annotations

import argparse
import json
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
from purax.io.checkpoint import Checkpointer


def throughput(task, data, *, every, directory):
  state = task.init(jax.random.key(0), data[0])
  ckpt = Checkpointer(directory, keep_last=2) if every else None
  start = time.perf_counter()
  state, _ = purax.fit(task, state, data, log_every=100, progress=False, checkpointer=ckpt,
                       checkpoint_every=every)
  jax.block_until_ready(state.params)
  elapsed = time.perf_counter() - start   # includes waiting for the last commit
  if ckpt is not None:
    ckpt.close()
  return len(data) / elapsed


def big_state(width: int):
  model = purax.nn.MLP(num_classes=10, features=(width, width))
  task = purax.Task(model=model, tx=purax.adamw(total_steps=10))
  batch = {'x': np.zeros((2, 64), np.float32), 'y': np.zeros((2,), np.int32)}
  state = jax.jit(task.init)(jax.random.key(0), batch)
  return task, batch, state


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=400)
  parser.add_argument('--every', default='25,50,100,200')
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
  throughput(task, pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=64, seed=0,
                                          num_steps=2), every=0, directory=None)  # compile
  everies = [int(e) for e in args.every.split(',')]
  runs = {'none': [], **{f'every_{e}': [] for e in everies}}
  for trial in range(args.trials):   # interleaved, so drift hits every variant alike
    runs['none'].append(throughput(task, data, every=0, directory=None))
    for e in everies:
      d = os.path.join(scratch, f'throughput-{trial}-{e}')
      runs[f'every_{e}'].append(throughput(task, data, every=e, directory=d))
      shutil.rmtree(d, ignore_errors=True)
  med = {k: statistics.median(v) for k, v in runs.items()}
  results['throughput'] = {
      'model': 'cnn', 'dataset': 'digits', 'batch_size': 64, 'steps': args.steps,
      'steps_per_sec_median': med, 'steps_per_sec_all': runs,
      'slowdown': {k: 1.0 - v / med['none'] for k, v in med.items() if k != 'none'},
      'seconds_between_saves': {f'every_{e}': e / med['none'] for e in everies}}
  for e in everies:
    print(f"checkpoint every {e} steps (~{e / med['none']:.2f} s of training): "
          f"{med[f'every_{e}']:.1f} vs {med['none']:.1f} steps/s, slowdown "
          f"{100 * results['throughput']['slowdown'][f'every_{e}']:.1f}%")

  if args.big:
    results['size'] = big_checkpoint(args, scratch)
  if not args.dir:
    shutil.rmtree(scratch, ignore_errors=True)
  os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
  with open(args.out, 'w') as f:
    json.dump(results, f, indent=2)
  print(f'wrote {args.out}')


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
  abstract = jax.eval_shape(lambda: {'state': state})
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
