"""Host work per training step of ``purax.fit``, counted rather than timed.

Timing ratios on a shared 2-core machine move 5-10% between two runs of one
commit; a count of the Python calls ``fit`` makes per step does not. This
script runs ``fit`` (MLP, a list of numpy batches ``[64, 8, 8, 1]``,
``steps_per_call=1``, logging every 100 steps, no progress bar, no
checkpoints) for ``--steps`` and for twice that under ``cProfile``, and
reports the difference per step: the calls a step adds, with the fixed cost
of starting (tracing, compiling, the first log) cancelled out. The same
count is made for the hand-written loop (``params, opt_state, loss =
step(params, opt_state, batch)``), so the two read side by side.

It runs against the API of this commit and of 6e849cd (before the
loop-of-hooks redesign: ``fit(log_every=..., progress=...)``), so the two
commits can be counted with one script::

  PYTHONPATH=. python benchmarks/host_work.py --out after.json
  git worktree add /tmp/before 6e849cd
  PYTHONPATH=/tmp/before python benchmarks/host_work.py --out before.json

The count is deterministic for a given installed environment (the same jax,
flax and optax); ``--repeat`` reruns it to show so.
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import pstats

import jax
import jax.numpy as jnp
import numpy as np
import optax

import purax
from purax import plan as plan_lib
from jsonout import write_json  # noqa: E402  (beside this script)

BATCH, LOG_EVERY = 64, 100


def batches(n):
  rng = np.random.default_rng(0)
  return [{'x': rng.normal(size=(BATCH, 8, 8, 1)).astype(np.float32),
           'y': rng.integers(0, 10, BATCH).astype(np.int32)} for _ in range(n)]


def make_task(steps):
  tx = purax.adamw(learning_rate=2e-3, total_steps=steps, warmup_steps=10)
  return purax.Task(model=purax.nn.MLP(num_classes=10, features=(256, 256)), tx=tx)


def run_fit(task, data):
  """``fit`` over ``data`` at k=1, in this commit's API or 6e849cd's."""
  state = task.init(jax.random.key(0), data[0])
  if 'log_every' in inspect.signature(purax.fit).parameters:    # 6e849cd: 23 arguments
    plan = plan_lib.SingleDevice(task, 1, cadence=LOG_EVERY)
    state, _ = purax.fit(task, state, data, log_every=LOG_EVERY, progress=False, plan=plan)
  else:
    state, _ = purax.fit(task, state, data, plan=plan_lib.SingleDevicePlan(task),
                         steps_per_call=1,
                         hooks=purax.hooks.standard(log_every=LOG_EVERY, progress=False))
  jax.block_until_ready(state.params)


def run_handwritten(task, data):
  model, tx = task.model, optax.adamw(1e-3)

  def step(params, opt_state, batch):
    def loss_fn(p):
      logits = model.apply({'params': p}, batch['x'], train=False)
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch['y']).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  step = jax.jit(step, donate_argnums=(0, 1))
  params = model.init(jax.random.key(0), data[0]['x'])['params']
  params = jax.tree.map(jnp.copy, params)
  opt_state = tx.init(params)
  loss = None
  for batch in data:
    params, opt_state, loss = step(params, opt_state, batch)
  float(loss)


def profiled_calls(fn, *args) -> tuple[int, pstats.Stats]:
  profile = cProfile.Profile()
  profile.enable()
  fn(*args)
  profile.disable()
  stats = pstats.Stats(profile)
  return stats.total_calls, stats


def per_function(stats: pstats.Stats) -> dict[str, int]:
  return {f'{f[0].rsplit("site-packages/", 1)[-1]}:{f[2]}': row[1]
          for f, row in stats.stats.items()}


def calls_per_step(fn, steps: int) -> tuple[float, dict[str, float]]:
  """(calls per step, the functions that a step calls, per step)."""
  task_short, task_long = make_task(steps), make_task(2 * steps)
  for task in (task_short, task_long):             # tracing, compiling, first use: once each
    fn(task, batches(4))
  short, s_stats = profiled_calls(fn, task_short, batches(steps))
  long, l_stats = profiled_calls(fn, task_long, batches(2 * steps))
  a, b = per_function(s_stats), per_function(l_stats)
  rows = {k: (b.get(k, 0) - a.get(k, 0)) / steps for k in set(a) | set(b)}
  top = dict(sorted(((k, v) for k, v in rows.items() if v >= 0.5),
                    key=lambda kv: -kv[1])[:40])
  return (long - short) / steps, top


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=200,
                      help='the shorter run (the longer is twice this; both multiples of 100)')
  parser.add_argument('--repeat', type=int, default=1)
  parser.add_argument('--out', default=None, help='JSON file to write')
  args = parser.parse_args()
  result = {'purax_version': getattr(purax, '__version__', '?'), 'jax': jax.__version__,
            'steps': args.steps, 'fit': [], 'handwritten': []}
  for _ in range(args.repeat):
    for name, fn in (('fit', run_fit), ('handwritten', run_handwritten)):
      per_step, top = calls_per_step(fn, args.steps)
      result[name].append(per_step)
      result[f'{name}_functions'] = top
      print(f'{name}: {per_step:.2f} Python calls per step')
  if args.out:
    write_json(args.out, result, indent=1)


if __name__ == '__main__':
  main()
