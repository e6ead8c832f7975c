"""What the spike rollback's ring of host snapshots costs per step (issue 48).

The MLP and the CNN of ``purax train`` on digits (batch 64, the loss-spike
guard on: window 128, k 6), trained by ``purax.fit`` with ``steps_per_call=1``
and the standard hooks (log every 50 steps, no writer, no bar), in three
variants interleaved trial by trial (the order rotates by one each trial):

- ``guard``: the spike guard alone (spikes are skipped, nothing rolled back);
- ``ring50``: plus :class:`purax.hooks.SpikeRollback` (100 steps back, a check
  and a snapshot every 50 steps: ``purax train --spike-rollback 100
  --log-every 50``);
- ``ring10``: the same checking and snapshotting every 10 steps.

No spike occurs (the batches are the digits'), so the variants differ by the
ring only: per check the spike count read from the metrics window (the log
point's host copy; between log points one host read) and a copy of the state
(on the CPU a memcpy into the ring's arrays; on an accelerator a device copy
read to the host in a thread). Each variant's first run compiles untimed. The
median steps/s over trials, the median of each trial's paired ratio to
``guard`` (wall clock, and the process's CPU seconds, all threads:
``*_cpu_cost_paired_median``, which other processes' load moves less), and
the hook's own time (its calls and its array state's set-up timed:
``*_hook_share_of_step``, its seconds over the ``guard`` run's) are written as JSON with the load average before,
after and per trial. Nothing is asserted.

Usage: ``python benchmarks/rollback_ring.py [--steps 400] [--trials 5] [--out PATH]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import jax

import purax
from purax.app.models import get_model
from purax.io import datasets, pipeline
from jsonout import write_json  # noqa: E402  (beside this script)

BATCH = 64
VARIANTS = {'guard': None, 'ring50': 50, 'ring10': 10}


class Timed(purax.hooks.SpikeRollback):
  """The hook, with the seconds its calls and its array state's set-up at the
  fit's start (``init_arrays``, ``arrays = ...``) took (``seconds``)."""

  seconds = 0.0

  def _timed(self, fn, *args):
    start = time.perf_counter()
    try:
      return fn(*args)
    finally:
      self.seconds += time.perf_counter() - start

  def __call__(self, info):
    return self._timed(super().__call__, info)

  def init_arrays(self, state):
    return self._timed(super().init_arrays, state)

  @property
  def arrays(self):
    return purax.hooks.SpikeRollback.arrays.fget(self)

  @arrays.setter
  def arrays(self, value):
    self._timed(purax.hooks.SpikeRollback.arrays.fset, self, value)


HOOK_S: dict = {}
CPU_S: dict = {}


def run(task, batches, every, log_every=50) -> float:
  """Steps/s of one ``fit`` of ``batches`` (a ring checked every ``every`` steps,
  or none); the hook's seconds go to ``HOOK_S[every]``, the process's CPU
  seconds (every thread's) to ``CPU_S[every]``."""
  hooks = purax.hooks.standard(log_every=log_every, progress=False,
                               writer=purax.io.writers.MultiWriter([]))
  if every is not None:
    hooks.append(Timed(100, every=every))
  state = task.init(jax.random.key(0), batches[0])
  jax.block_until_ready(state)
  start, cpu = time.perf_counter(), time.process_time()
  state, _ = purax.fit(task, state, batches, steps_per_call=1, hooks=hooks)
  jax.block_until_ready(state.params)
  wall = time.perf_counter() - start
  CPU_S.setdefault(every, []).append(time.process_time() - cpu)
  if every is not None:
    HOOK_S.setdefault(every, []).append(hooks[-1].seconds)
  return len(batches) / wall


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=400)
  parser.add_argument('--trials', type=int, default=5)
  parser.add_argument('--models', default='mlp,cnn')
  parser.add_argument('--out', default='benchmarks/measured/cpu_s22/rollback_ring.json')
  args = parser.parse_args()
  ds = datasets.load('digits')
  results = {'platform': jax.devices()[0].platform, 'cpu_count': os.cpu_count(),
             'python': platform.python_version(), 'jax': jax.__version__,
             'steps': args.steps, 'batch_size': BATCH, 'trials': args.trials,
             'load_average_before': os.getloadavg(), 'models': {}}
  for name in args.models.split(','):
    task = purax.Task(model=get_model(name, num_classes=10),
                      tx=purax.adamw(learning_rate=2e-3, total_steps=args.steps, warmup_steps=50),
                      spike_guard=purax.SpikeGuard(window=128, k=6.0))
    data = pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=BATCH, seed=0,
                                  num_steps=args.steps)
    batches = [data[s] for s in range(args.steps)]
    for every in VARIANTS.values():              # compiles, untimed
      run(task, batches[:100], every)
    HOOK_S.clear()
    CPU_S.clear()
    speeds = {k: [] for k in VARIANTS}
    loads = []
    names = list(VARIANTS)
    for trial in range(args.trials):
      order = names[trial % len(names):] + names[:trial % len(names)]
      for variant in order:
        speeds[variant].append(run(task, batches, VARIANTS[variant]))
      loads.append(os.getloadavg()[0])
    guard = speeds['guard']
    model = {'steps_per_sec': {k: statistics.median(v) for k, v in speeds.items()},
             'all_steps_per_sec': speeds,
             'all_cpu_s': {k: CPU_S[every] for k, every in VARIANTS.items()},
             'load_average_1min_per_trial': loads}
    for variant in ('ring50', 'ring10'):
      paired = [g / r - 1 for g, r in zip(guard, speeds[variant])]
      model[f'{variant}_cost_of_step_paired_median'] = statistics.median(paired)
      model[f'{variant}_cost_of_step_of_medians'] = (
          statistics.median(guard) / statistics.median(speeds[variant]) - 1)
      # CPU seconds (all threads): what other processes' load changes least.
      model[f'{variant}_cpu_cost_paired_median'] = statistics.median(
          r / g - 1 for g, r in zip(CPU_S[None], CPU_S[VARIANTS[variant]]))
      # The hook's own time (its host read, the snapshot's copy) over the guard's step time.
      model[f'{variant}_hook_s_per_run_median'] = statistics.median(HOOK_S[VARIANTS[variant]])
      model[f'{variant}_hook_share_of_step'] = (statistics.median(HOOK_S[VARIANTS[variant]])
                                                / (args.steps / statistics.median(guard)))
    results['models'][name] = model
    results['load_average_after'] = os.getloadavg()
    write_json(args.out, results)
    print(name, {k: round(v, 1) for k, v in model['steps_per_sec'].items()},
          {k: round(v, 4) for k, v in model.items()
           if k.endswith(('median', 'medians', 'share_of_step'))},
          'load', loads)


if __name__ == '__main__':
  main()
