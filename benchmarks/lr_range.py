"""The learning-rate range test: the grid as one population against a sequential sweep.

Both train the job ``purax tune lr`` would (``--model``, ``--dataset``, the
CLI's task for ``--steps``, warmup ``--warmup-steps``) from one initial
state, at every rate of the same log-spaced grid, for the same steps, on the
same batches (on the device before timing):

- ``population``: :func:`purax.tune.lr_range_test` — every member each call,
  one compiled program (``--strategy``: ``auto``, ``vmap``, ...);
- ``sequential``: one run per rate after another, each from the initial
  state with its rate set, with ``purax.plan.train_step`` (what
  ``purax.fit`` runs): one compiled program reused by every rate (a rate is
  a value in the state, not a recompilation) — how Lightning's or fastai's
  sweeps go, without their per-run start-up.

Both read their curve the same way (:meth:`purax.tune.LRRange.of`: the mean
loss of the last quarter of the steps, a diverged rate left out) and suggest
by ``--rule``; the JSON records both suggestions and the largest difference
between their per-step losses, also per rate relative to the sequential
run's (the same computation: zero up to XLA's program-dependent rounding,
which a large rate amplifies step by step). Each time is the median of ``--trials``
interleaved rounds after a warm-up call; ``compile_s`` is the warm-up call's
excess over the median. Writes JSON (default
``benchmarks/results/lr_range.json``); asserts nothing.

Usage: ``python benchmarks/lr_range.py [--model cnn] [--dataset digits] [--steps 100]
[--num-lrs 16] [--strategy auto] [--trials 3]``; the small LM:
``--model lm --dataset pystdlib --batch-size 16 --seq-len 128``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax
import numpy as np

import purax
from purax import tune
from purax.app import job as job_lib
from purax.app.config import TrainConfig
from purax.core import metrics as metrics_lib
from purax.core import population as pop_lib
from purax.plan import train_step
from jsonout import write_json  # noqa: E402  (beside this script)


def build(args):
  flat = dict(model=args.model, dataset=args.dataset, steps=args.steps,
              batch_size=args.batch_size, warmup_steps=args.warmup_steps, progress=False)
  if args.model == 'lm':
    flat.update(seq_len=args.seq_len, d_model=args.d_model, num_layers=args.num_layers,
                num_heads=args.num_heads)
  config = TrainConfig.of(**flat).validate().resolved()
  job = job_lib.build(config, mesh=False)
  batches = [jax.device_put(job.train_data[s]) for s in range(args.steps)]
  return job, batches


def population(job, batches, lrs, args):
  state = job.init(0)
  return tune.lr_range_test(job.task, state, batches, lrs=lrs, steps=args.steps,
                            rule=args.rule, strategy=args.strategy)


def sequential(job, batches, lrs, args):
  """One run per rate, one after another; per-step losses as the population's."""
  task = job.task
  abstract = jax.eval_shape(lambda s, b: task.step(s, b)[1], job.abstract['state'], batches[0])
  columns, diverged = [], []
  for lr in lrs:
    state = purax.set_hyperparams(job.init(0), learning_rate=float(lr))
    windows = []
    for batch in batches:
      state, acc = train_step(task, state, metrics_lib.zeros_like(abstract), batch)
      windows.append((acc['loss'], acc['skipped']))
    losses, gone = [], False
    for loss, skipped in jax.device_get(windows):
      gone = gone or float(skipped.value) > 0          # a population freezes it for good
      losses.append(np.nan if gone or not loss.count else float(loss.total / loss.count))
    columns.append(losses)
    diverged.append(gone)
  return tune.LRRange.of(lrs, np.asarray(columns).T, diverged,
                         window=max(1, args.steps // 4), rule=args.rule)


def timed(fn, *args):
  begin = time.perf_counter()
  out = fn(*args)
  return time.perf_counter() - begin, out


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--model', default='cnn', help='a model of the CLI table (default: %(default)s)')
  p.add_argument('--dataset', default='digits')
  p.add_argument('--steps', type=int, default=100)
  p.add_argument('--batch-size', type=int, default=64)
  p.add_argument('--warmup-steps', type=int, default=0)
  p.add_argument('--num-lrs', type=int, default=16)
  p.add_argument('--min-lr', type=float, default=1e-5)
  p.add_argument('--max-lr', type=float, default=1.0)
  p.add_argument('--rule', default='steepest', choices=tune.RULES)
  p.add_argument('--strategy', default='auto', help=f'one of {pop_lib.STRATEGIES} or a chunk size')
  p.add_argument('--seq-len', type=int, default=128, help='--model lm')
  p.add_argument('--d-model', type=int, default=None, help='--model lm')
  p.add_argument('--num-layers', type=int, default=None, help='--model lm')
  p.add_argument('--num-heads', type=int, default=None, help='--model lm')
  p.add_argument('--trials', type=int, default=3)
  p.add_argument('--out', default='benchmarks/results/lr_range.json')
  args = p.parse_args()
  for name in ('steps', 'batch_size', 'num_lrs', 'trials'):
    if getattr(args, name) < 1:
      p.error(f'--{name.replace("_", "-")}: expected >= 1, got {getattr(args, name)}')
  if args.strategy not in pop_lib.STRATEGIES:
    args.strategy = int(args.strategy)
  job, batches = build(args)
  lrs = tune.log_grid(args.min_lr, args.max_lr, args.num_lrs)
  first = {'population': timed(population, job, batches, lrs, args)[0],
           'sequential': timed(sequential, job, batches, lrs, args)[0]}
  times = {name: [] for name in first}
  results = {}
  for _ in range(args.trials):          # interleaved: contention hits both alike
    for name, fn in (('population', population), ('sequential', sequential)):
      seconds, results[name] = timed(fn, job, batches, lrs, args)
      times[name].append(seconds)
  median = {name: statistics.median(t) for name, t in times.items()}
  pop, seq = results['population'], results['sequential']
  both = np.isfinite(pop.losses) & np.isfinite(seq.losses)
  device = jax.devices()[0]
  out = {'platform': device.platform, 'device_kind': device.device_kind, 'jax': jax.__version__,
         'host': platform.node(), 'args': vars(args), 'lrs': [float(v) for v in lrs],
         'seconds': median, 'trials': times,
         'compile_s': {name: first[name] - median[name] for name in first},
         'speedup': median['sequential'] / median['population'],
         'suggestion': {'population': pop.suggestion, 'sequential': seq.suggestion},
         'same_suggestion': pop.suggestion == seq.suggestion,
         'diverged': {'population': pop.diverged.tolist(), 'sequential': seq.diverged.tolist()},
         'max_loss_difference': float(np.max(np.abs(pop.losses - seq.losses)[both],
                                             initial=0.0)),
         # per rate: a large rate amplifies the programs' different rounding
         'max_relative_loss_difference': [
             float(np.max((np.abs(pop.losses - seq.losses) / np.abs(seq.losses))[:, i][both[:, i]],
                          initial=0.0)) for i in range(len(lrs))]}
  print(json.dumps({k: out[k] for k in ('seconds', 'compile_s', 'speedup', 'suggestion',
                                        'max_loss_difference')}, indent=1))
  write_json(args.out, out)


if __name__ == '__main__':
  main()
