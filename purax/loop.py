"""``fit()``: the thin host loop that drives the pure functions.

The train step is jitted once per (task, shapes) with the state and the
running metrics donated; metrics stay on the device and are merged inside the
same compiled call, so the loop's only host syncs are the log points (every
``log_every`` steps) and evaluation. The next batch is put on the device while
the current step runs.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

import jax
from tqdm.auto import tqdm

from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, NonFiniteError, expect
from purax.core.state import TrainState
from purax.core.task import Task
from purax.io.checkpoint import Checkpointer
from purax.io.pipeline import prefetch_to_device
from purax.io.writers import MetricWriter


def _train_step(task: Task, state: TrainState, acc, batch):
  state, metrics = task.step(state, batch)
  return state, metrics_lib.merge(acc, metrics)


def _eval_step(task: Task, state: TrainState, acc, batch):
  return metrics_lib.merge(acc, task.evaluate(state, batch))


# Built once per process: the cache key is (task, shapes), so a second fit with
# the same task — e.g. another learning rate in the state — does not recompile.
train_step = jax.jit(_train_step, static_argnums=0, donate_argnums=(1, 2))
eval_step = jax.jit(_eval_step, static_argnums=0, donate_argnums=2)


def zero_metrics(fn: Callable, *args):
  """Zeroed metrics tree of the structure ``fn(*args)`` returns (no compute)."""
  return metrics_lib.zeros_like(jax.eval_shape(fn, *args))


def evaluate(task: Task, state: TrainState, batches: Iterable) -> dict[str, float]:
  """Metrics over all ``batches`` (padded batches carry ``weight``), as numbers.

  One compiled evaluation step for fixed-size batches; one host transfer at
  the end.
  """
  batches = iter(batches)
  first = next(batches, None)
  expect(first is not None, 'eval batches', 'at least one batch', 'none', ConfigError)
  acc = zero_metrics(task.evaluate, state, first)
  for batch in prefetch_to_device(_chain(first, batches)):
    acc = eval_step(task, state, acc, batch)
  return metrics_lib.compute(acc)


def _chain(first, rest):
  yield first
  yield from rest


def fit(task: Task, state: TrainState, train_data: Sequence, *,
        eval_data: Iterable | None = None, log_every: int = 50, eval_every: int = 0,
        writer: MetricWriter | None = None, progress: bool = True,
        prefetch: int = 2, checkpointer: Checkpointer | None = None,
        checkpoint_every: int = 0, train_metrics=None,
        should_stop: Callable[[], bool] | None = None, plan=None,
        max_consecutive_skips: int | None = 10,
        ) -> tuple[TrainState, list[dict[str, float]]]:
  """Trains from ``state.step`` to ``len(train_data)``.

  Args:
    task: the static model/optimizer/objective.
    state: the initial (or restored) state; consumed (donated).
    train_data: random access by step, ``train_data[s]`` is the batch of step
      ``s`` (e.g. :func:`purax.io.pipeline.train_dataset`); training resumes at
      ``state.step``.
    eval_data: evaluation batches, iterated afresh at every evaluation (e.g.
      :func:`purax.io.pipeline.eval_batches`).
    log_every: fetch and write the training metrics every this many steps
      (the loop's only host sync).
    eval_every: evaluate every this many steps and at the end (0: only at the end
      when ``eval_data`` is given).
    writer: receives ``train/*``, ``eval/*`` and ``steps_per_sec`` scalars.
    progress: show a progress bar (steps/s, loss, ETA).
    prefetch: batches put on the device ahead of the step.
    checkpointer: saves ``{'state', 'train_metrics'}`` every
      ``checkpoint_every`` steps (asynchronously; with the evaluation metrics
      when evaluated at that step, for keep-best), when stopped, and at the end
      (then waits for the commit).
    checkpoint_every: steps between checkpoints (0: only at the end).
    train_metrics: the running metrics window to continue (from a
      checkpoint), so a resumed run logs bitwise what the straight run logs.
    should_stop: polled after every step (a cheap host flag, e.g. set by a
      SIGTERM handler); when true the loop checkpoints and returns early with
      ``state.step < len(train_data)``.
    plan: a :class:`purax.parallel.Sharded` (``parallel.sharded(task, mesh,
      rules, batch)``): the step runs on its mesh, the state is placed in its
      sharding, and with several processes each feeds only its rows of every
      global batch (``train_data[s]``). Only process 0 writes.
    max_consecutive_skips: stop with :class:`NonFiniteError` when this many
      consecutive steps had non-finite gradients (skipped updates; seen at the
      next log point, naming the step window); ``None``: never.

  Returns:
    ``(state, history)``: the final state and every record written.

  Raises:
    ConfigError: ``log_every`` or ``eval_every`` out of range.
    DataError: a malformed batch (checked before compiling).
    NonFiniteError: ``max_consecutive_skips`` consecutive skipped updates.
  """
  expect(log_every >= 1, 'log_every', '>= 1', log_every, ConfigError)
  expect(eval_every >= 0, 'eval_every', '>= 0', eval_every, ConfigError)
  num_steps = len(train_data)
  start = int(jax.device_get(state.step))      # host read before the loop only
  expect(0 <= start <= num_steps, 'state.step', f'in [0, {num_steps}]', start, ConfigError)
  history: list[dict[str, float]] = []

  def write(step, scalars):
    history.append({'step': step, **scalars})
    if writer is not None and jax.process_index() == 0:
      writer.write_scalars(step, scalars)

  expect(checkpoint_every >= 0, 'checkpoint_every', '>= 0', checkpoint_every, ConfigError)
  if start < num_steps:
    task.check_batch(train_data[start])
    acc = train_metrics
    if acc is None:
      acc = zero_metrics(lambda st, b: task.step(st, b)[1], state, train_data[start])

  def save(step, metrics=None):
    if checkpointer is not None:
      checkpointer.save(step, {'state': state, 'train_metrics': acc}, metrics=metrics)

  bar = tqdm(total=num_steps, initial=start, disable=not progress, unit='step',
             dynamic_ncols=True)
  host_batches = (train_data[s] for s in range(start, num_steps))
  if plan is None:
    batches = prefetch_to_device(host_batches, prefetch)
    run_step = lambda state, acc, batch: train_step(task, state, acc, batch)
  else:
    from purax.parallel import distributed   # the loop drives parallel, not the reverse
    state = jax.device_put(state, plan.state_sharding)   # no-op when already placed
    if jax.process_count() > 1:
      rows = distributed.process_rows(plan.mesh, plan.rules,
                                      len(plan.sample_batch['x']))
      batches = (distributed.global_batch({k: v[rows] for k, v in b.items()},
                                          plan.mesh, plan.rules) for b in host_batches)
    else:
      batches = prefetch_to_device(host_batches, prefetch, plan.batch_sharding)
    run_step = plan.train_step
  last_time, last_step = time.perf_counter(), start
  window_start = start
  for step, batch in enumerate(batches, start=start + 1):
    state, acc = run_step(state, acc, batch)
    bar.update(1)
    if step % log_every == 0 or step == num_steps:
      # The one host sync of the loop: fetch the merged metrics of the window.
      scalars = {f'train/{k}': v for k, v in metrics_lib.compute(acc).items()}
      now = time.perf_counter()
      scalars['steps_per_sec'] = (step - last_step) / max(now - last_time, 1e-9)
      last_time, last_step = now, step
      acc = metrics_lib.zeros_like(acc)
      bar.set_postfix(loss=f"{scalars['train/loss']:.4f}", refresh=False)
      write(step, scalars)
      streak = scalars.get('train/skip_streak', 0)
      if max_consecutive_skips is not None and streak >= max_consecutive_skips:
        bar.close()
        raise NonFiniteError(
            f'train/skip_streak: expected fewer than {max_consecutive_skips} consecutive '
            f'steps with non-finite gradients, got {int(streak)} ending in steps '
            f'({window_start}, {step}]; the state is that of the last finite update '
            f'(try a lower learning rate, clipping, or --debug-nans to find the source)')
      window_start = step
    eval_scalars = None
    if eval_data is not None and ((eval_every and step % eval_every == 0)
                                  or step == num_steps):
      eval_scalars = {f'eval/{k}': v for k, v in evaluate(task, state, eval_data).items()}
      write(step, eval_scalars)
      last_time = time.perf_counter()   # evaluation time is not training time
    stop = should_stop is not None and should_stop()
    if (checkpoint_every and step % checkpoint_every == 0) or step == num_steps or stop:
      save(step, eval_scalars)
    if stop:
      break
  bar.close()
  if writer is not None:
    writer.flush()
  if checkpointer is not None:
    checkpointer.wait()
  return state, history
