"""Step overhead: purax ``fit`` vs a hand-written flax+optax loop vs a tutorial loop.

All three train the same model on the same batches (digits, batch 64) with the
same optimizer settings, in one process, interleaved over several trials (the
variants' order rotates by one every trial); the median steps/s of each is
written as JSON after each model. Compilation is excluded (each path is warmed
up first: purax by one untimed ``fit`` of the same settings). Nothing is
asserted: the numbers go to the README.

- ``purax_fit``: ``purax.fit`` with its defaults over the same list of
  numpy batches the hand-written loops take (a list is handed to the step
  without a copy; numpy on the CPU, prefetched to the device elsewhere,
  donated state, metrics merged on device and fetched every
  ``log_every`` steps, the skip-on-non-finite guard, ``steps_per_call='auto'``:
  the k its rule picks is recorded as ``auto_steps_per_call``; no progress bar
  or writer).
- ``purax_fit_steps1``: the same with ``steps_per_call=1``.
- ``purax_fit_grain``: ``steps_per_call=1`` reading the grain training
  dataset (``purax.io.pipeline.train_dataset``, a batch gathered at every
  step) instead of the list: what the data source costs on top.
- ``purax_fit_noguard``: ``steps_per_call=1`` and ``Task(skip_nonfinite=False)``:
  what the guard (the update under a ``lax.cond``, zeroed metrics of a
  skipped step, two more counters) costs.
- ``purax_fit_noreplay``: ``steps_per_call=1`` with the standard hooks but
  :class:`purax.hooks.NonFiniteReplay` (which replays a skipped non-finite
  update): what that hook costs while every update is finite (by design
  nothing: it reads one number of the log record at each log point;
  ``tests/hooks/test_nonfinite.py`` counts the host reads).
- ``purax_fit_spikes``: ``steps_per_call=1`` and ``Task(spike_guard=
  purax.SpikeGuard())`` (window 128, k 6): what the loss-spike guard costs
  (the window's mean and deviation, its ring update, one more counter).
- ``purax_fit_k16``: ``purax.fit(..., steps_per_call=16)``: 16 steps per
  dispatch (``lax.scan`` over stacked batches), bitwise the same training.
- ``purax_train_step_loop``: the plan's jitted train step (what ``fit``
  calls at k = 1) in a bare ``for`` loop over the same numpy batches:
  ``fit_steps1_vs_its_train_step_loop`` is what ``fit``'s host loop costs,
  ``train_step_loop_vs_handwritten_numpy`` what purax's compiled step costs
  against the hand-written one.
- ``handwritten``: ``jax.jit(train_step, donate_argnums=0)`` over pre-built numpy
  batches, ``jax.device_put`` per step, the loss read once at the end — the
  loop an experienced JAX engineer writes.
- ``handwritten_numpy``: the same loop passing the numpy batch to the jitted
  step (no ``jax.device_put``), which on the CPU is faster than
  ``device_put`` first and is what ``fit`` does on the CPU
  (``purax.plan.to_step``). The ratios ``*_vs_handwritten_numpy`` compare
  purax with this loop.
- ``tutorial``: the same step, reading ``float(loss)`` after every step (a host
  sync per step), as tutorials do.

``call_return_us_median``: how long the jitted call of each hand-written loop
holds the host (the median over trials of each trial's median, microseconds).
With numpy arguments XLA:CPU has run the step when the call returns, so every
microsecond of host work per step adds to the step's time; with device arrays
(``device_put``) the call returns once the step is queued.

Ratios to the hand-written loop are given two ways: of the medians
(``purax_vs_handwritten`` ...) and the median of each trial's ratio
(``paired_vs_handwritten``, with its quartiles in ``paired_quartiles``), which
drift between trials moves less. Only the first trial warms purax's paths up
with an untimed ``fit`` (later ones find everything compiled), so more trials
fit in the time: single trials move ±10-20% on a shared 2-core machine, and a
3% question needs many of them.

Usage: ``python benchmarks/step_overhead.py [--steps 400] [--trials 5] [--out PATH]``

The machine's load is not controlled: on a shared machine compare the
ratios (interleaved trials), not the absolute steps/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import optax

import purax
from purax import plan as plan_lib
from purax.io import datasets, pipeline
from purax.app.models import get_model
from jsonout import write_json  # noqa: E402  (beside this script)


def handwritten_step(model, tx):
  def loss_fn(params, batch):
    logits = model.apply({'params': params}, batch['x'], train=False)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch['y']).mean()

  @jax.jit
  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return jax.jit(step.__wrapped__, donate_argnums=(0, 1))


def handwritten_tx(total_steps: int) -> optax.GradientTransformation:
  """The hand-written loops' optimizer: ``purax.adamw(learning_rate=2e-3,
  warmup_steps=50)``'s settings written with optax (clipping at 1, weight decay 1e-4)."""
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
      optax.warmup_cosine_decay_schedule(0.0, 2e-3, 50, total_steps), weight_decay=1e-4))


def run_handwritten(task, state, batches, *, sync_every_step, device_put=True, returned=None):
  """Steps/s of the hand-written loop; with a list ``returned``, the median
  time (us) its jitted call held the host is appended to it
  (``call_return_us_median``, the module docstring)."""
  tx = handwritten_tx(len(batches))
  step = handwritten_step(task.model, tx)
  params = jax.tree.map(jnp.copy, state.params)
  opt_state = tx.init(params)
  params, opt_state, loss = step(params, opt_state, jax.device_put(batches[0]))  # compile
  jax.block_until_ready(loss)
  start = time.perf_counter()
  losses, calls = [], []
  for batch in batches:
    batch = jax.device_put(batch) if device_put else batch
    called = time.perf_counter()
    params, opt_state, loss = step(params, opt_state, batch)
    if returned is not None:
      calls.append(time.perf_counter() - called)
    if sync_every_step:
      losses.append(float(loss))        # the tutorial's per-step host sync
  float(loss)
  speed = len(batches) / (time.perf_counter() - start)
  if returned is not None:
    returned.append(statistics.median(calls) * 1e6)
  return speed


def run_train_step_loop(task, batches):
  """Steps/s of the plan's jitted train step (what ``fit`` calls: the step
  and the metrics merged into the packed window) in a bare ``for`` loop over
  the numpy batches, the window read once at the end: the compiled step
  without ``fit``'s host loop."""
  plan = plan_lib.SingleDevicePlan(task)
  state = task.init(jax.random.key(0), batches[0])
  acc = plan.zero_metrics(state, batches[0])
  state, acc = plan.train_step(state, acc, batches[0])       # compiled by the warm-up fit
  jax.block_until_ready(acc)
  start = time.perf_counter()
  for batch in batches:
    state, acc = plan.train_step(state, acc, batch)
  jax.block_until_ready(acc)
  return len(batches) / (time.perf_counter() - start)


def run_purax(task, data, *, log_every, steps_per_call='auto', warm_up=True, replay=True):
  """Steps/s of one timed ``fit`` after an untimed one with the same settings
  (which compiles what the timed one runs; ``warm_up=False`` from the second
  trial on, when it is compiled); also the k that was run. ``replay=False``:
  without :class:`purax.hooks.NonFiniteReplay`."""
  k = steps_per_call
  if k != 'auto':
    log_every = max(k, log_every // k * k)
  plan = None
  for timed in (False, True) if warm_up else (True,):
    state = task.init(jax.random.key(0), data[0])
    # fit(plan=None) builds exactly this plan; built here to read the k it chose.
    plan = plan_lib.SingleDevicePlan(task)
    start = time.perf_counter()
    hooks = [h for h in purax.hooks.standard(log_every=log_every, progress=False)
             if replay or not isinstance(h, purax.hooks.NonFiniteReplay)]
    state, _ = purax.fit(task, state, data, plan=plan, steps_per_call=k, hooks=hooks)
    jax.block_until_ready(state.params)
  return len(data) / (time.perf_counter() - start), plan.chosen_steps_per_call


DS = None
BATCH = 64


def main():
  global DS
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=400)
  parser.add_argument('--trials', type=int, default=5)
  parser.add_argument('--log-every', type=int, default=100)
  parser.add_argument('--models', default='cnn,mlp')
  parser.add_argument('--out', default='benchmarks/results/step_overhead.json')
  args = parser.parse_args()
  DS = datasets.load('digits')
  results = {'platform': jax.devices()[0].platform, 'device_kind': jax.devices()[0].device_kind,
             'cpu_count': os.cpu_count(), 'python': platform.python_version(),
             'jax': jax.__version__, 'steps': args.steps, 'batch_size': BATCH,
             'trials': args.trials, 'models': {}}
  for name in args.models.split(','):
    model = get_model(name, num_classes=10)
    task = purax.Task(model=model, tx=purax.adamw(learning_rate=2e-3, total_steps=args.steps,
                                                  warmup_steps=50))
    data = pipeline.train_dataset(DS.x_train, DS.y_train, batch_size=BATCH, seed=0,
                                  num_steps=args.steps)
    batches = [data[s] for s in range(args.steps)]
    state = task.init(jax.random.key(0), batches[0])
    noguard = dataclasses.replace(task, skip_nonfinite=False)
    spikes = dataclasses.replace(task, spike_guard=purax.SpikeGuard())
    runs = {'purax_fit': [], 'purax_fit_steps1': [], 'purax_fit_grain': [],
            'purax_fit_noguard': [], 'purax_fit_noreplay': [], 'purax_fit_spikes': [],
            'purax_fit_k16': [], 'purax_train_step_loop': [], 'handwritten': [],
            'handwritten_numpy': [], 'tutorial': []}
    chosen = []
    call_return_us = {'numpy': [], 'device_put': []}

    warm = {'up': True}        # the first trial's fits compile: warmed up untimed

    def purax_run(t, k, source=None, replay=True):
      speed, chosen_k = run_purax(t, batches if source is None else source,
                                  log_every=args.log_every, steps_per_call=k,
                                  warm_up=warm['up'], replay=replay)
      if k == 'auto':
        chosen.append(chosen_k)
      return speed

    variants = {
        'purax_fit': lambda: purax_run(task, 'auto'),
        'purax_fit_steps1': lambda: purax_run(task, 1),
        'purax_fit_grain': lambda: purax_run(task, 1, data),
        'purax_fit_noguard': lambda: purax_run(noguard, 1),
        'purax_fit_noreplay': lambda: purax_run(task, 1, replay=False),
        'purax_fit_spikes': lambda: purax_run(spikes, 1),
        'purax_fit_k16': lambda: purax_run(task, 16),
        'purax_train_step_loop': lambda: run_train_step_loop(task, batches),
        'handwritten': lambda: run_handwritten(task, state, batches, sync_every_step=False,
                                               returned=call_return_us['device_put']),
        'handwritten_numpy': lambda: run_handwritten(task, state, batches,
                                                     returned=call_return_us['numpy'],
                                                     sync_every_step=False, device_put=False),
        'tutorial': lambda: run_handwritten(task, state, batches, sync_every_step=True),
    }
    order = list(variants)
    for trial in range(args.trials):
      # Interleaved, so drift hits all alike; the order rotates every trial,
      # so no variant always runs right after the same other one.
      for variant in order[trial % len(order):] + order[:trial % len(order)]:
        runs[variant].append(variants[variant]())
      warm['up'] = False
    med = {k: statistics.median(v) for k, v in runs.items()}
    hw = med['handwritten']
    results['models'][name] = {
        'steps_per_sec_median': med, 'steps_per_sec_all': runs,
        'auto_steps_per_call': chosen,
        'purax_vs_handwritten': med['purax_fit'] / hw,
        'purax_steps1_vs_handwritten': med['purax_fit_steps1'] / hw,
        'purax_multistep_vs_handwritten': med['purax_fit_k16'] / hw,
        'purax_noguard_vs_handwritten': med['purax_fit_noguard'] / hw,
        # The two options of issue 31, each against the k=1 run it differs from.
        'replay_hook_vs_without': statistics.median(
            x / h for x, h in zip(runs['purax_fit_steps1'], runs['purax_fit_noreplay'])),
        'spike_guard_vs_without': statistics.median(
            x / h for x, h in zip(runs['purax_fit_spikes'], runs['purax_fit_steps1'])),
        # fit's host loop against its own compiled step in a bare loop, and
        # that step against the hand-written one: where the k=1 gap is.
        'fit_steps1_vs_its_train_step_loop': statistics.median(
            x / h for x, h in zip(runs['purax_fit_steps1'], runs['purax_train_step_loop'])),
        'train_step_loop_vs_handwritten_numpy': statistics.median(
            x / h for x, h in zip(runs['purax_train_step_loop'], runs['handwritten_numpy'])),
        'purax_vs_tutorial': med['purax_fit'] / med['tutorial'],
        'purax_vs_handwritten_numpy': med['purax_fit'] / med['handwritten_numpy'],
        'purax_steps1_vs_handwritten_numpy': med['purax_fit_steps1'] / med['handwritten_numpy'],
        # The median over trials of each trial's ratio (the variants of a
        # trial run back to back): less moved by load that drifts between
        # trials than the ratio of the medians above.
        'paired_vs_handwritten': {
            k: statistics.median(x / h for x, h in zip(runs[k], runs['handwritten']))
            for k in ('purax_fit', 'purax_fit_steps1', 'purax_fit_k16', 'purax_fit_noguard')},
        'paired_quartiles': {
            k: statistics.quantiles([x / h for x, h in zip(runs[k], runs['handwritten'])], n=4)
            for k in ('purax_fit', 'purax_fit_steps1', 'purax_fit_k16', 'purax_fit_noguard')},
        'paired_vs_handwritten_numpy': {
            k: statistics.median(x / h for x, h in zip(runs[k], runs['handwritten_numpy']))
            for k in ('purax_fit', 'purax_fit_steps1', 'purax_fit_k16', 'purax_fit_noguard',
                      'purax_fit_grain', 'handwritten')},
    }
    # The median over trials of each trial's median call-return time (us) of
    # the two hand-written loops without a per-step sync.
    results['models'][name]['call_return_us_median'] = {
        k: statistics.median(v) for k, v in call_return_us.items()}
    r = results['models'][name]
    print(f"{name}: purax {med['purax_fit']:.1f} steps/s (auto k={chosen}; k=1 "
          f"{med['purax_fit_steps1']:.1f}, no guard {med['purax_fit_noguard']:.1f}, k=16 "
          f"{med['purax_fit_k16']:.1f}), handwritten {hw:.1f}, tutorial {med['tutorial']:.1f} "
          f"-> {r['purax_vs_handwritten']:.3f}x / k=1 {r['purax_steps1_vs_handwritten']:.3f}x / "
          f"k=16 {r['purax_multistep_vs_handwritten']:.3f}x handwritten, "
          f"{r['purax_vs_tutorial']:.3f}x tutorial; paired auto "
          f"{r['paired_vs_handwritten']['purax_fit']:.3f}x, k=1 "
          f"{r['paired_vs_handwritten']['purax_fit_steps1']:.3f}x; handwritten numpy "
          f"{med['handwritten_numpy']:.1f}: auto {r['purax_vs_handwritten_numpy']:.3f}x, k=1 "
          f"{r['purax_steps1_vs_handwritten_numpy']:.3f}x", flush=True)
    # After every model, atomically: a run cut short keeps the finished ones.
    write_json(args.out, results, say=False)
  print(f'wrote {args.out}')


if __name__ == '__main__':
  main()
