"""Populations: K members in one program vs K sequential single runs.

Both train the same MLP (256, 256) (``--model cnn``: :class:`purax.nn.CNN`) on
digits (8x8 = 64 inputs, batch 64) with
AdamW at K different learning rates (log-spaced 1e-4 .. 1e-2) and K seeds, for
the same number of steps, in one process:

- ``population_<strategy>``: :func:`purax.plan.members.train_step`
  (divergence checks included), one jitted call per step for all K members,
  with the population strategy ``'auto'`` (what ``fit`` uses; the chunk size
  it picks is recorded) and each of ``--strategies`` (``vmap``,
  ``sequential``, ``chunked`` or a chunk size);
- ``sequential_runs``: ``purax.plan.train_step`` (what ``purax.fit`` runs), K
  runs one after the other, one jitted call per step per run.

Populations smaller than 16 repeat the steps (``16 // K`` times; the JSON's
``steps`` is the total), so every trial is long enough to time on a busy
machine. Batches are on the device before timing; compilation is excluded (every path
is warmed up) and reported separately. Trials are interleaved (every variant
once per round), so CPU contention and drift hit all alike; each figure is the
median of ``--trials``. Nothing is asserted; the JSON records the platform
(CPU, GPU, TPU: whatever ``jax.devices()`` has) and ``speedup`` (sequential
runs' time over the ``'auto'`` population's), ``speedup_by_strategy``.

Usage: ``python benchmarks/population.py [--steps 50] [--trials 3] [--members 1,8,64]
[--strategies vmap,sequential,4,16]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import purax
from purax.core import metrics as metrics_lib
from purax.core import population as P
from purax.plan import members
from purax.io import datasets
from purax.core.metrics import zeros_of as zero_metrics
from purax.plan import train_step
from jsonout import write_json  # noqa: E402  (beside this script)


def build(steps: int, width: int = 256, model: str = 'mlp'):
  ds = datasets.load('digits')
  # Fixed batches drawn with numpy (compute only, no input pipeline: also runs
  # on a GPU image without grain).
  rng = np.random.default_rng(0)
  batches = [jax.device_put({'x': ds.x_train[i], 'y': ds.y_train[i]})
             for i in (rng.choice(len(ds.x_train), 64, replace=False) for _ in range(steps))]
  net = (purax.nn.MLP(num_classes=10, features=(width, width)) if model == 'mlp'
         else purax.nn.CNN(num_classes=10))
  task = purax.Task(model=net,
                    tx=purax.adamw(learning_rate=1e-3, total_steps=steps, warmup_steps=0))
  return task, batches


def population(task, batches, k, strategy='auto', reps=1):
  lrs = np.geomspace(1e-4, 1e-2, k).astype(np.float32)
  pop = jax.jit(P.init, static_argnums=0)(task, jax.vmap(jax.random.key)(jnp.arange(k)),
                                          {'learning_rate': lrs}, batches[0])
  acc = members.zero_train_metrics(task, pop, batches[0])
  jax.block_until_ready(pop)
  t = time.perf_counter()
  for b in batches * reps:
    pop, acc = members.train_step(task, pop, acc, b, None, strategy=strategy)
  jax.block_until_ready((pop, acc))
  return time.perf_counter() - t


def sequential(task, batches, k, reps=1):
  lrs = np.geomspace(1e-4, 1e-2, k).astype(np.float32)
  init = jax.jit(lambda key, lr: purax.set_hyperparams(task.init(key, batches[0]),
                                               {'learning_rate': lr}))
  states = [init(jax.random.key(i), lrs[i]) for i in range(k)]
  template = zero_metrics(lambda st, b: task.step(st, b)[1], states[0], batches[0])
  jax.block_until_ready(states)
  t = time.perf_counter()
  for state in states:
    acc = metrics_lib.zeros_like(template)
    for b in batches * reps:
      state, acc = train_step(task, state, acc, b)
    jax.block_until_ready((state, acc))
  return time.perf_counter() - t


def _strategy(text: str):
  return int(text) if text.isdigit() else text


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=50)
  parser.add_argument('--trials', type=int, default=3)
  parser.add_argument('--members', default='1,8,64')
  parser.add_argument('--strategies', default='auto',
                      help="comma-separated population strategies to time beside 'auto' "
                           "(vmap, chunked, sequential, or a chunk size), e.g. "
                           "'vmap,sequential,4,8,16' to measure the rule")
  parser.add_argument('--width', type=int, default=256, help='MLP hidden width')
  parser.add_argument('--model', choices=('mlp', 'cnn'), default='mlp',
                      help="'cnn': purax.nn.CNN on the 8x8 images (convolutions, which "
                           'XLA:CPU runs slowly inside loops unless purax unrolls them)')
  parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                    'population.json'))
  args = parser.parse_args()
  task, batches = build(args.steps, args.width, args.model)
  strategies = ['auto'] + [_strategy(x) for x in args.strategies.split(',')
                           if x and x != 'auto']
  results = []
  for k in (int(m) for m in args.members.split(',')):
    # Small populations repeat the steps, so that every trial trains about 16 x
    # steps member-steps and lasts long enough to be timed on a busy machine.
    reps = max(1, 16 // k)
    variants = {f'population_{s}': (lambda b, s=s: population(task, b, k, s, reps))
                for s in strategies}
    variants['sequential_runs'] = lambda b: sequential(task, b, k, reps)
    warmup_s = {}
    for name, fn in variants.items():
      t = time.perf_counter()
      if name == 'sequential_runs':
        sequential(task, batches[:2], 1)   # compile once; K runs share the program
      else:
        population(task, batches[:2], k, name[len('population_'):] if not name[-1].isdigit()
                   else int(name.rsplit('_', 1)[1]))
      warmup_s[name] = time.perf_counter() - t
    runs = {name: [] for name in variants}
    for _ in range(args.trials):   # interleaved: contention and drift hit every variant alike
      for name, fn in variants.items():
        runs[name].append(fn(batches))
    times = {name: statistics.median(v) for name, v in runs.items()}
    seq = times['sequential_runs']
    row = {'members': k, 'steps': args.steps * reps,
           'strategy': 'auto', 'chunk_size': P.chunk_size('auto', k),
           'population_s': times['population_auto'], 'sequential_s': seq,
           'speedup': seq / times['population_auto'],
           # best of the trials: less sensitive to other jobs on a shared machine
           'speedup_best_of_trials': min(runs['sequential_runs']) / min(runs['population_auto']),
           'member_steps_per_s_population': k * args.steps * reps / times['population_auto'],
           'member_steps_per_s_sequential': k * args.steps * reps / seq,
           'speedup_by_strategy': {
               f"{s}" + (f" (chunk {P.chunk_size(s, k)})" if not isinstance(s, int) else ''):
               seq / times[f'population_{s}'] for s in strategies},
           'seconds_all_trials': runs, 'warmup_s': warmup_s}
    print(json.dumps({key: row[key] for key in ('members', 'chunk_size', 'speedup',
                                                 'speedup_by_strategy')}))
    results.append(row)
  device = jax.devices()[0]
  n_params = sum(x.size for x in jax.tree.leaves(
      jax.eval_shape(task.init, jax.random.key(0), batches[0]).params))
  out = {'benchmark': 'population',
         'model': f'MLP({args.width}, {args.width})' if args.model == 'mlp' else 'CNN',
         'params_per_member': int(n_params), 'dataset': 'digits (64 inputs)',
         'batch_size': 64, 'platform': device.platform, 'device_kind': device.device_kind,
         'device_count': jax.device_count(), 'jax': jax.__version__,
         'python': platform.python_version(), 'cpu_count': os.cpu_count(),
         'auto_cpu_chunk': P.AUTO_CPU_CHUNK, 'results': results}
  write_json(args.out, out)


if __name__ == '__main__':
  main()
