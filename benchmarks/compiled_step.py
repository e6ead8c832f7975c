"""The compiled step alone: purax's step (with and without the non-finite guard)
against the hand-written flax+optax step, on batches already on the device.

What ``step_overhead.py`` measures minus ``fit``'s host loop (the data
lookup, the prefetch queue, the cadence checks): the same model, optimizer
and batches (digits, batch 64), ``purax.plan.train_step`` (the program ``fit``
runs at ``steps_per_call=1``) and the hand-written step of
``step_overhead.py``, each called ``--steps`` times in a row and synced once,
interleaved over ``--trials`` rounds; medians of ms per step and the median
of each round's ratio to the hand-written step. Nothing is asserted.

Usage: ``python benchmarks/compiled_step.py [--models mlp,cnn] [--steps 200]
[--trials 15] [--out PATH]``
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import jax

import purax
from purax import plan as plan_lib
from purax.app.models import get_model
from purax.io import datasets, pipeline

from step_overhead import BATCH, handwritten_step, handwritten_tx
from jsonout import write_json  # noqa: E402  (beside this script)


def purax_ms(task, batches):
  state = task.init(jax.random.key(0), batches[0])
  acc = plan_lib.SingleDevicePlan(task).zero_metrics(state, batches[0])
  state, acc = plan_lib.train_step(task, state, acc, batches[0])    # compiled, untimed
  jax.block_until_ready(acc)
  start = time.perf_counter()
  for batch in batches:
    state, acc = plan_lib.train_step(task, state, acc, batch)
  jax.block_until_ready(acc)
  return (time.perf_counter() - start) / len(batches) * 1e3


def handwritten_ms(task, step, tx, batches):
  params = task.init(jax.random.key(0), batches[0]).params
  opt_state = tx.init(params)
  params, opt_state, loss = step(params, opt_state, batches[0])     # compiled, untimed
  jax.block_until_ready(loss)
  start = time.perf_counter()
  for batch in batches:
    params, opt_state, loss = step(params, opt_state, batch)
  jax.block_until_ready(loss)
  return (time.perf_counter() - start) / len(batches) * 1e3


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--models', default='mlp,cnn')
  parser.add_argument('--steps', type=int, default=200)
  parser.add_argument('--trials', type=int, default=15)
  parser.add_argument('--out', default='benchmarks/results/compiled_step.json')
  args = parser.parse_args()
  ds = datasets.load('digits')
  results = {'platform': jax.devices()[0].platform, 'cpu_count': os.cpu_count(),
             'jax': jax.__version__, 'steps': args.steps, 'trials': args.trials, 'models': {}}
  for name in args.models.split(','):
    task = purax.Task(model=get_model(name, num_classes=10),
                      tx=purax.adamw(learning_rate=2e-3, total_steps=600, warmup_steps=50))
    data = pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=BATCH, seed=0,
                                  num_steps=args.steps)
    batches = [jax.device_put(data[i]) for i in range(args.steps)]
    tx = handwritten_tx(600)
    step = handwritten_step(task.model, tx)
    noguard = dataclasses.replace(task, skip_nonfinite=False)
    variants = {'purax_step': lambda: purax_ms(task, batches),
                'purax_step_noguard': lambda: purax_ms(noguard, batches),
                'handwritten_step': lambda: handwritten_ms(task, step, tx, batches)}
    runs = {k: [] for k in variants}
    order = list(variants)
    for trial in range(args.trials):
      for variant in order[trial % 3:] + order[:trial % 3]:
        runs[variant].append(variants[variant]())
    hw = runs['handwritten_step']
    results['models'][name] = {
        'ms_per_step_median': {k: statistics.median(v) for k, v in runs.items()},
        'ms_per_step_all': runs,
        # ms ratio inverted: > 1 means purax's step is faster.
        'paired_speed_vs_handwritten': {
            k: statistics.median(h / x for x, h in zip(runs[k], hw))
            for k in ('purax_step', 'purax_step_noguard')}}
    r = results['models'][name]
    print(f"{name}: ms/step {({k: round(v, 4) for k, v in r['ms_per_step_median'].items()})}, "
          f"speed vs hand-written (paired) "
          f"{({k: round(v, 3) for k, v in r['paired_speed_vs_handwritten'].items()})}",
          flush=True)
    write_json(args.out, results, say=False)
  print(f'wrote {args.out}')


if __name__ == '__main__':
  main()
