"""Memory of the compiled train step: remat and gradient accumulation.

Reads ``compiled.memory_analysis()`` of ``jax.jit(task.step)`` (XLA's buffer
assignment, no run needed): ``temp`` bytes are the step's scratch — mostly the
activations kept for the backward pass — and ``argument``/``output`` bytes the
state and batch. Two sweeps on the transformer encoder (post-LN, layers
stacked by ``nn.scan``: ``scan_layers=True``, as measured before the default
became unrolled up to 6 layers):

1. remat policy ``none`` vs ``full`` / ``dots_saveable`` /
   ``dots_with_no_batch_dims_saveable`` at a fixed batch. Target: ``full``
   cuts activation memory >= 2x.
2. gradient accumulation ``k`` in {1, 4, 16} microbatches at a fixed global
   batch. Target: k=16 cuts activation memory >= 8x.

Optionally (``--time``) the step time of float32 vs bfloat16 compute on the
current device (meaningful on a GPU). Writes JSON (default
``benchmarks/results/memory.json``); asserts nothing.

Usage: ``python benchmarks/memory.py [--d-model 256 --layers 6 --seq 128 --batch 64] [--time]``
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import purax
from purax.core.precision import get_policy
from purax.app.models import get_model
from jsonout import write_json  # noqa: E402  (beside this script)


def build(args, *, remat='none', microbatches=1, precision='fp32'):
  model = get_model('transformer', num_classes=10, d_model=args.d_model,
                             num_layers=args.layers, num_heads=args.heads, dropout_rate=0.1,
                             remat=remat, scan_layers=True,
                             **get_policy(precision).model_kwargs())
  task = purax.Task(model=model, tx=purax.adamw(total_steps=100), microbatches=microbatches)
  rng = np.random.default_rng(0)
  batch = {'x': rng.normal(size=(args.batch, args.seq, args.features)).astype(np.float32),
           'y': rng.integers(0, 10, size=(args.batch,)).astype(np.int32)}
  state = jax.eval_shape(task.init, jax.random.key(0), batch)
  return task, state, batch


def memory(args, **kwargs):
  task, state, batch = build(args, **kwargs)
  t0 = time.perf_counter()
  compiled = jax.jit(task.step, donate_argnums=0).lower(state, batch).compile()
  stats = compiled.memory_analysis()
  return {'temp_bytes': int(stats.temp_size_in_bytes),
          'argument_bytes': int(stats.argument_size_in_bytes),
          'output_bytes': int(stats.output_size_in_bytes),
          'compile_s': time.perf_counter() - t0}


def step_time(args, precision, repeats=20):
  task, _, batch = build(args, precision=precision)
  state = jax.jit(task.init)(jax.random.key(0), batch)
  batch = jax.device_put(batch)
  step = jax.jit(task.step, donate_argnums=0)
  state, m = step(state, batch)
  jax.block_until_ready(m)
  t0 = time.perf_counter()
  for _ in range(repeats):
    state, m = step(state, batch)
  jax.block_until_ready(m)
  return (time.perf_counter() - t0) / repeats


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--d-model', type=int, default=256)
  p.add_argument('--layers', type=int, default=6)
  p.add_argument('--heads', type=int, default=8)
  p.add_argument('--seq', type=int, default=128)
  p.add_argument('--features', type=int, default=16)
  p.add_argument('--batch', type=int, default=64)
  p.add_argument('--time', action='store_true', help='also time fp32 vs bf16 steps')
  p.add_argument('--remat', default='none,full,dots_saveable,dots_with_no_batch_dims_saveable',
                 help='comma-separated remat policies to compare (default: %(default)s)')
  p.add_argument('--out', default='benchmarks/results/memory.json')
  args = p.parse_args()
  for name in ('d_model', 'layers', 'heads', 'seq', 'features', 'batch'):
    if getattr(args, name) < 1:
      p.error(f'--{name.replace("_", "-")}: expected >= 1, got {getattr(args, name)}')
  if args.d_model % args.heads:
    p.error(f'--d-model: expected a multiple of --heads={args.heads}, got {args.d_model}')
  device = jax.devices()[0]
  out = {'platform': device.platform, 'device_kind': device.device_kind, 'jax': jax.__version__,
         'model': {k: getattr(args, k) for k in ('d_model', 'layers', 'heads', 'seq', 'features',
                                                 'batch')}}
  policies = [r for r in args.remat.split(',') if r]
  if 'none' not in policies:
    policies.insert(0, 'none')   # the baseline of the reductions
  out['remat'] = {r: memory(args, remat=r) for r in policies}
  base = out['remat']['none']['temp_bytes']
  for r, v in out['remat'].items():
    v['reduction'] = base / max(v['temp_bytes'], 1)
    print(f"remat={r:34s} temp {v['temp_bytes'] / 2**20:8.1f} MiB  ({v['reduction']:.2f}x less)")
  # k microbatches need a batch that k divides; the others are recorded as skipped.
  counts = [k for k in (1, 4, 16) if args.batch % k == 0]
  skipped = [k for k in (1, 4, 16) if args.batch % k]
  if skipped:
    print(f'microbatches {skipped}: skipped (they do not divide --batch {args.batch})')
    out['accumulation_skipped'] = skipped
  out['accumulation'] = {str(k): memory(args, microbatches=k) for k in counts}
  base = out['accumulation']['1']['temp_bytes']
  for k, v in out['accumulation'].items():
    v['reduction'] = base / max(v['temp_bytes'], 1)
    print(f"microbatches={k:>2s} temp {v['temp_bytes'] / 2**20:8.1f} MiB  ({v['reduction']:.2f}x less)")
  if args.time:
    out['step_time_s'] = {p: step_time(args, p) for p in ('fp32', 'bf16')}
    print('step time', out['step_time_s'])
  write_json(args.out, out)


if __name__ == '__main__':
  main()
