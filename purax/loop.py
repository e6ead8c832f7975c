"""``fit()``: the thin host loop that drives the pure functions.

The train step is jitted once per (task, shapes) with the state and the
running metrics donated; metrics stay on the device and are merged inside the
same compiled call, so the loop's only host syncs are the log points (every
``log_every`` steps) and evaluation. On an accelerator the next batch is put
on the device while the current step runs.

Data comes from either kind of source:

- random access (``len()`` and ``data[s]``, e.g. a grain ``MapDataset`` or
  :func:`purax.io.pipeline.train_dataset`): batch ``s`` is ``data[s]``, so the
  data position is ``state.step`` and resume is exact;
- any iterable of batches (a generator, a grain ``IterDataset``, a
  ``tf.data``/torch loader yielding numpy arrays): iterated in order. When the
  iterator has ``get_state()`` / ``set_state()`` (grain's ``DatasetIterator``)
  its state after the last consumed batch is saved in every checkpoint and
  restored on resume (``data_state``), so resume is exact; a plain iterator
  cannot be repositioned, and ``iterator_resume`` says what happens then.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import signal
import threading
import time
import warnings
from typing import Any, Callable, Iterable, Literal

import jax
import numpy as np

from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, NonFiniteError, expect
from purax.core.state import TrainState
from purax.core.task import Task
from purax import hooks as hooks_lib
from purax import plan as plan_lib
from purax.io import progress as progress_lib
from purax.io.checkpoint import Checkpointer
from purax.io.resume import Restored
from purax.io.writers import MetricWriter
from purax.plan import eval_step as eval_step
from purax.plan import multi_train_step as multi_train_step
from purax.plan import train_step as train_step
from purax.plan import zero_metrics as zero_metrics


class StopOnSignal(contextlib.AbstractContextManager):
  """Turns SIGTERM/SIGINT into a flag polled by the loop; a second signal acts as usual.

  Use as ``with StopOnSignal() as stop: fit(..., should_stop=stop)``: the
  loop then finishes its step, checkpoints and returns; ``stop.received``
  names the signal. Handlers are installed only on the main thread.
  """

  def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
    self.signals, self.received, self._previous = signals, None, {}

  def __call__(self) -> bool:
    return self.received is not None

  def _handle(self, signum, frame):
    self.received = signal.Signals(signum).name
    for s, handler in self._previous.items():
      signal.signal(s, handler)

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for s in self.signals:
        self._previous[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    return False


def evaluate(task: Task, state: TrainState, batches: Iterable, *, plan=None
             ) -> dict[str, float]:
  """Metrics over all ``batches`` (padded batches carry ``weight``), as numbers.

  One compiled evaluation step for fixed-size batches; one host transfer at
  the end. With a ``plan`` (:mod:`purax.plan`, or a
  :func:`purax.parallel.sharded` plan) the batches are evaluated by it:
  placed on its mesh, or for every population member (``[members]`` arrays).

  Raises:
    ConfigError: no batches.
  """
  return metrics_lib.compute(plan_lib.as_plan(plan, task).evaluate(state, batches))


def is_random_access(data) -> bool:
  """Whether ``data`` is read by step (``len()`` and ``data[s]``), not iterated."""
  return hasattr(data, '__len__') and hasattr(data, '__getitem__') and not isinstance(
      data, (dict, str, bytes))


class _Source:
  """The batches of steps ``start, start + 1, ...`` and the data position after each."""

  def __init__(self, data, start: int, steps: int | None, data_state, iterator_resume: str):
    expect(iterator_resume in ('error', 'warn', 'skip'), 'iterator_resume',
           "'error', 'warn' or 'skip'", repr(iterator_resume), ConfigError)
    self.positions = collections.deque()
    if is_random_access(data):
      self.num_steps = len(data) if steps is None else steps
      expect(self.num_steps <= len(data), 'steps', f'<= len(train_data) = {len(data)}',
             self.num_steps, ConfigError)
      self.batches = (data[s] for s in range(start, self.num_steps))
      self.stateful = False
      return
    self.num_steps = steps
    iterator = iter(data)
    self.stateful = callable(getattr(iterator, 'get_state', None)) and callable(
        getattr(iterator, 'set_state', None))
    if start > 0:
      if self.stateful and data_state is not None:
        iterator.set_state(data_state)
      elif iterator_resume == 'error':
        raise ConfigError(
            f'train_data: expected a data position to resume at step {start}, got '
            + ('none (pass data_state= from the checkpoint)' if self.stateful else
               f'a {type(iterator).__name__} that cannot be repositioned (pass '
               "iterator_resume='warn' to continue from where it is, 'skip' to draw and "
               "drop the first steps' batches, or a random-access source)"))
      elif iterator_resume == 'warn':
        warnings.warn(f'purax: resuming at step {start}: the data position is not restored '
                      f'({type(iterator).__name__} has no get_state/set_state); training '
                      'continues on the batches the iterator yields next', RuntimeWarning,
                      stacklevel=3)
      else:
        for _ in range(start):
          expect(next(iterator, None) is not None, 'train_data',
                 f'at least {start} batches to skip on resume', 'fewer', ConfigError)
    self.iterator = iterator
    self.batches = self._iterate(start)

  def _iterate(self, start):
    for _ in (range(start, self.num_steps) if self.num_steps is not None else iter(int, 1)):
      batch = next(self.iterator, None)
      if batch is None:
        return
      self.positions.append(self.iterator.get_state() if self.stateful else None)
      yield batch

  def position(self) -> Any:
    """The data position after the batch just consumed (JSON-serialisable) or None."""
    return self.positions.popleft() if self.positions else None


def _checked(batches, check):
  for batch in batches:
    check(batch)
    yield batch


def _iterator_position(value) -> dict:
  return {} if value is None else {'iterator': value}


def fit(task: Task, state: TrainState, train_data, *, steps: int | None = None,
        eval_data: Iterable | None = None, log_every: int = 50, eval_every: int = 0,
        writer: MetricWriter | None = None, progress: bool = True,
        prefetch: int = 2, checkpointer: Checkpointer | None = None,
        checkpoint_every: int = 0, train_metrics=None,
        should_stop: Callable[[], bool] | None = None, plan=None,
        max_consecutive_skips: int | None = 10, data_state: Any = None,
        iterator_resume: Literal['error', 'warn', 'skip'] = 'error',
        steps_per_call: int | Literal['auto'] = 'auto', hooks=(), hook_state: dict | None = None,
        hook_arrays: dict | None = None,
        checks: Literal['first', 'every', 'none'] = 'first',
        ) -> tuple[Any, list[dict[str, Any]]]:
  """Trains from ``state.step`` to ``steps``.

  Args:
    task: the static model/optimizer/loss.
    state: the initial (or restored) state — a :class:`TrainState`, or what the
      plan steps (a :class:`purax.core.population.Population`); consumed
      (donated). A :class:`purax.io.resume.Restored` (what
      :func:`purax.restore_or_init` returns) brings its metrics window, data
      position and hook state along.
    train_data: random access by step (``train_data[s]`` is the batch of step
      ``s``) or any iterable of batches; see the module docstring. Its
      loader may refill a batch's arrays once it has yielded it: on the CPU
      (and for batches held for a multi-step call) ``fit`` trains on a copy
      (:func:`purax.io.pipeline.owned`).
    steps: the step to train to; default ``len(train_data)`` (random access)
      or until the iterable ends.
    eval_data: evaluation batches, iterated afresh at every evaluation (e.g.
      :func:`purax.io.pipeline.eval_batches`).
    log_every: fetch and write the training metrics every this many steps
      (the loop's only host sync).
    eval_every: evaluate every this many steps and at the end (0: only at the end
      when ``eval_data`` is given).
    writer: receives ``train/*``, ``eval/*`` and ``steps_per_sec`` scalars.
    progress: show a progress bar (steps/s, loss, ETA).
    prefetch: batches put on the device ahead of the step (on an accelerator
      or a mesh; on one CPU device the jitted call takes each numpy batch
      itself, :func:`purax.plan.to_step`).
    checkpointer: saves ``{'state', 'train_metrics'}`` every
      ``checkpoint_every`` steps, at log/eval points where its wall-clock
      cadence says so (:meth:`Checkpointer.should_save`, ``interval_s``: 300 s
      by default), when stopped, and at the end (then waits for the commit);
      asynchronously, with the evaluation metrics when evaluated at that step
      (for keep-best); the extra JSON holds the data position
      (``{'data': {'next_step', 'iterator'}}``).
    checkpoint_every: steps between checkpoints (0: none besides the
      checkpointer's wall-clock cadence, the stop and the end).
    train_metrics: the running metrics window to continue (from a
      checkpoint), so a resumed run logs bitwise what the straight run logs.
    should_stop: polled after every step (a cheap host flag, e.g. set by a
      SIGTERM handler, :class:`StopOnSignal`); when true the loop checkpoints
      and returns early.
    plan: how the state is placed and stepped (:mod:`purax.plan`): None (one
      device), a :func:`purax.parallel.sharded` plan (the step on its mesh,
      the state in its sharding, each process feeding only its rows of every
      global batch), or ``purax.plan.Population(task)`` (every member of a
      population at once; metrics ``[members]``; training ends early when
      every member is frozen). Only process 0 writes.
    max_consecutive_skips: stop with :class:`NonFiniteError` when this many
      consecutive steps had non-finite gradients (skipped updates; seen at the
      next log point, naming the step window); ``None``: never.
    data_state: an iterable's saved position (``extra['data']['iterator']``
      of the checkpoint resumed from), restored with ``set_state``.
    iterator_resume: what resuming (``state.step > 0``) with an iterable that
      cannot be repositioned does: ``'error'`` (default) refuses, ``'warn'``
      says in one line that the data position is not restored and continues
      on what the iterator yields, ``'skip'`` draws and drops ``state.step``
      batches first (exact for a deterministic iterable).
    steps_per_call: ``k`` steps per dispatch (``lax.scan`` of the step over
      ``k`` stacked batches, unrolled on the CPU when the model has
      convolutions (:mod:`purax.core.loops`): one host-to-device transfer and
      one Python iteration per ``k`` steps), with exactly the result of ``k`` single
      steps (bitwise on CPU). Calls end at multiples of ``k``; the steps
      before the first (a resumed run) and after the last run one at a time,
      so ``log_every``, ``eval_every``, ``checkpoint_every`` and the hooks'
      ``every`` must be multiples of ``k``; ``should_stop`` is polled per
      call. ``'auto'`` (default): the first 5 steps run singly and are timed
      (a host sync each), then ``k`` is the largest divisor of the gcd of
      those cadences that is <= ``min(32, ceil(10 ms / step time))``, and 1
      unless the rest of the run saves (at 10% of the step time) more than
      the second compilation costs (:func:`purax.plan.choose_steps_per_call`):
      a small model stops paying Python and dispatch per step, a large one
      or a short run keeps ``k = 1``. With a ``plan``, ``'auto'`` is 1 and an
      integer ``k > 1`` is refused (single device only).
    hooks: :mod:`purax.hooks` run at log/eval points on their own cadence
      (early stopping, PBT, EMA, histograms, your callbacks); their
      ``state_dict()`` is saved in every checkpoint (``extra['hooks']``), their
      ``arrays`` (hooks with ``init_arrays``) in its array tree; an
      ``info['histograms']`` goes to ``writer.write_histograms`` when the
      writer has it.
    hook_state: the hooks' saved state to continue from
      (``restore_or_init(...).extra.get('hooks')``).
    hook_arrays: the array state of the hooks that have ``init_arrays``
      (:class:`purax.hooks.EMA`), ``{name: tree}``, to continue from
      (``restore_or_init(..., hooks=hooks).hook_arrays``); a hook without
      saved arrays starts from ``hook.init_arrays(state)``. Saved in every
      checkpoint's array tree under ``'hooks'``.
    checks: value checks of the batches on the host (:meth:`Task.check_values`:
      labels and token ids in range, weights finite and >= 0, for the provided
      losses): ``'first'`` batch only (default: before anything compiles),
      ``'every'`` batch (a host pass over each batch: for debugging data), or
      ``'none'``. Shapes and dtypes are always checked (at trace time).

  Returns:
    ``(state, history)``: the final state and every record written.

  Raises:
    ConfigError: ``log_every`` or ``eval_every`` out of range; an iterable
      that cannot be repositioned under ``iterator_resume='error'``.
    DataError, ContractError: a malformed batch or loss (at the first trace).
    NonFiniteError: ``max_consecutive_skips`` consecutive skipped updates.
  """
  if isinstance(state, Restored):      # fit(task, restore_or_init(...), data, ...)
    train_metrics = state.train_metrics if train_metrics is None else train_metrics
    data_state = state.data_state if data_state is None else data_state
    hook_state = state.extra.get('hooks') if hook_state is None else hook_state
    hook_arrays = state.hook_arrays if hook_arrays is None else hook_arrays
    state = state.state
  deleted = [jax.tree_util.keystr(path) for path, x in
             jax.tree_util.tree_flatten_with_path(state)[0]
             if isinstance(x, jax.Array) and x.is_deleted()]
  expect(not deleted, 'state', 'live arrays (fit donates its state: pass a copy, '
         'jax.tree.map(jnp.copy, state), to keep one)',
         f'deleted arrays at {deleted[:3]}', ConfigError)
  expect(log_every >= 1, 'log_every', '>= 1', log_every, ConfigError)
  expect(eval_every >= 0, 'eval_every', '>= 0', eval_every, ConfigError)
  expect(checkpoint_every >= 0, 'checkpoint_every', '>= 0', checkpoint_every, ConfigError)
  expect(steps is None or (isinstance(steps, int) and steps >= 0), 'steps',
         'None or an integer >= 0', steps, ConfigError)
  expect(not isinstance(train_data, dict), 'train_data',
         'batches (a random-access dataset or an iterable of batches), not one batch',
         f'a dict with keys {sorted(train_data)}' if isinstance(train_data, dict) else '',
         ConfigError)
  expect(eval_data is None or eval_every == 0 or iter(eval_data) is not eval_data,
         'eval_data', 'a collection iterated afresh at every evaluation (a list, a grain '
         'dataset)', f'a one-shot {type(eval_data).__name__}', ConfigError)
  hooks = list(hooks)
  k = steps_per_call
  expect(k == 'auto' or (isinstance(k, int) and k >= 1), 'steps_per_call',
         "an integer >= 1 or 'auto'", k, ConfigError)
  cadences = [('log_every', log_every), ('eval_every', eval_every),
              ('checkpoint_every', checkpoint_every)]
  cadences += [(f'{type(hook).__name__}.every', hook.every) for hook in hooks]
  for i, (name, every) in enumerate(cadences):
    multiple = '' if k == 'auto' else f'a multiple of steps_per_call={k}'
    expect(every >= 0 and (k == 'auto' or every % k == 0), name,
           ' and '.join(filter(None, ['>= 0' if i >= 3 else '', multiple])) or '>= 0', every,
           ConfigError)
  plan = plan_lib.as_plan(plan, task, steps_per_call,
                          cadence=math.gcd(*[every for _, every in cadences]))
  for hook in hooks:
    saved = (hook_state or {}).get(getattr(hook, 'name', type(hook).__name__))
    if saved is not None and hasattr(hook, 'load_state_dict'):
      hook.load_state_dict(saved)
  start = plan.start_step(state)      # host read before the loop only
  source = _Source(train_data, start, steps, data_state, iterator_resume)
  num_steps = source.num_steps
  expect(num_steps is None or 0 <= start <= num_steps, 'state.step',
         f'in [0, {num_steps}]', start, ConfigError)
  history: list[dict[str, Any]] = []

  def write(step, scalars):
    history.append({'step': step, **scalars})
    if writer is not None and jax.process_index() == 0:
      writer.write_scalars(step, scalars)

  expect(checks in ('first', 'every', 'none'), 'checks', "'first', 'every' or 'none'",
         repr(checks), ConfigError)
  host_batches = source.batches
  first = next(host_batches, None)
  if first is not None and checks != 'none' and isinstance(
      plan, (plan_lib.SingleDevice, plan_lib.Sharded)):
    abstract = task.abstract_state(first)   # no transfer; traced once per (task, shapes)
    task.check_values(first, abstract)
    if checks == 'every':
      host_batches = _checked(host_batches, lambda b: task.check_values(b, abstract))
  acc = train_metrics
  state = plan.place(state)
  array_hooks = {getattr(h, 'name', type(h).__name__): h for h in hooks
                 if callable(getattr(h, 'init_arrays', None))}
  for name, hook in array_hooks.items():
    saved = (hook_arrays or {}).get(name)
    hook.arrays = hook.init_arrays(state) if saved is None else saved
  if first is not None and acc is None:
    acc = plan.zero_metrics(state, first)
  host_batches = itertools.chain([first], host_batches) if first is not None else iter(())
  position = {'next_step': start, **_iterator_position(data_state)}

  def save(step, metrics=None):
    if checkpointer is not None:
      extra = {'data': dict(position)}
      states = {getattr(h, 'name', type(h).__name__): h.state_dict() for h in hooks
                if hasattr(h, 'state_dict')}
      if states:
        extra['hooks'] = states
      tree = {'state': state, 'train_metrics': acc}
      if array_hooks:
        tree['hooks'] = {name: h.arrays for name, h in array_hooks.items()}
      checkpointer.save(step, tree, metrics=metrics, extra=extra)

  def log(step, window_start):
    """The loop's one host sync: fetch the merged metrics of the window."""
    nonlocal acc, last_time, last_step
    scalars = {f'train/{name}': v for name, v in metrics_lib.compute(acc).items()}
    now = time.perf_counter()
    scalars['steps_per_sec'] = (step - last_step) / max(now - last_time, 1e-9)
    last_time, last_step = now, step
    acc = metrics_lib.zeros_like(acc)
    if np.ndim(scalars.get('train/loss', ())) == 0 and 'train/loss' in scalars:
      bar.set_postfix(loss=f"{scalars['train/loss']:.4f}", refresh=False)
    write(step, scalars)
    streak = float(np.max(scalars.get('train/skip_streak', 0)))
    if max_consecutive_skips is not None and streak >= max_consecutive_skips:
      bar.close()
      raise NonFiniteError(
          f'train/skip_streak: expected fewer than {max_consecutive_skips} consecutive '
          f'steps with non-finite gradients, got {int(streak)} ending in steps '
          f'({window_start}, {step}]; the state is that of the last finite update '
          f'(try a lower learning rate, clipping, or --debug-nans to find the source)')
    return scalars

  def run_eval(step):
    """Evaluates, writes ``eval/*`` and returns it (a host sync, not training time)."""
    nonlocal last_time
    scalars = {f'eval/{name}': v for name, v in
               metrics_lib.compute(plan.evaluate(state, eval_data)).items()}
    write(step, scalars)
    last_time = time.perf_counter()
    return scalars

  def run_hooks(step, at_end, evaluated, record):
    nonlocal state
    stop = False
    for hook in hooks:
      due = (evaluated if hook.every == 0 else step % hook.every == 0)
      if due and (not at_end or hook.at_end):
        state, info = hook(step, state, record)
        info = dict(info or {})
        stop = bool(info.pop('stop', False)) or stop
        histograms = info.pop('histograms', None)
        if histograms and writer is not None and jax.process_index() == 0 and hasattr(
            writer, 'write_histograms'):
          writer.write_histograms(step, histograms)
        if info:
          write(step, info)
    return stop

  bar = progress_lib.bar(num_steps, start, enabled=progress)
  done = {'logged': None, 'evaluated': None, 'saved': None}   # the last step of each
  last_time, last_step = time.perf_counter(), start
  window_start = step = start
  for batch, taken in plan.device_batches(host_batches, start=start, num_steps=num_steps,
                                          prefetch=prefetch):
    state, acc = plan.train_step(state, acc, batch)
    step += taken
    for _ in range(taken):
      iterator_position = source.position()
    position = {'next_step': step, **_iterator_position(iterator_position)}
    bar.update(taken)
    at_end = step == num_steps
    record = {}
    if step % log_every == 0 or at_end:
      record.update(log(step, window_start))
      window_start = done['logged'] = step
      at_end = at_end or plan.finished(state)
    eval_scalars = None
    if eval_data is not None and ((eval_every and step % eval_every == 0) or at_end):
      eval_scalars = run_eval(step)
      record.update(eval_scalars)
    hook_stop = run_hooks(step, at_end, eval_scalars is not None, record)
    stop = hook_stop or (should_stop is not None and should_stop())
    if ((checkpoint_every and step % checkpoint_every == 0) or at_end or stop
        or (record and checkpointer is not None and checkpointer.should_save(step))):
      save(step, eval_scalars if eval_scalars and np.ndim(
          next(iter(eval_scalars.values()))) == 0 else None)
      done['saved'] = step
    if eval_scalars is not None:
      done['evaluated'] = step
    if stop or at_end:
      break
  else:
    if step > start and step != num_steps:
      # An iterable ran out: that is the end of training (logged, evaluated and
      # saved, unless its last step already was).
      if done['logged'] != step:
        log(step, window_start)
      eval_scalars = None
      if eval_data is not None and done['evaluated'] != step:
        eval_scalars = run_eval(step)
      if done['saved'] != step:
        save(step, eval_scalars)
  bar.close()
  if writer is not None:
    writer.flush()
  if checkpointer is not None:
    checkpointer.wait()
  return state, history


def fit_population(task, pop, train_data, *, batch_index=None, plan=None,
                   eval_data=None, eval_every: int = 0, log_every: int = 50,
                   metric: str = 'loss', mode: Literal['min', 'max'] = 'min',
                   patience: int = 0, pbt_every: int = 0, pbt_fraction: float = 0.25,
                   pbt_names=None, pbt_bounds=None,
                   pbt_key: jax.Array | None = None, progress: bool = True):
  """Trains a population from its step to ``len(train_data)``: :func:`fit`
  with the :class:`purax.plan.Population` plan and the population hooks
  (``purax sweep`` is this).

  Args:
    task: the :class:`Task` every member runs.
    pop: the :class:`purax.core.population.Population`; consumed (donated).
    train_data: ``train_data[s]`` is step ``s``'s batch, shared, or stacked
      ``[n, batch, ...]`` with ``batch_index`` (see :func:`population.step`).
    batch_index: int32 ``[members]`` or None.
    plan: a :class:`purax.plan.Population` (e.g. on a mesh); default
      ``Population(task, batch_index)``.
    eval_data: evaluation batches shared by all members, iterated afresh.
    eval_every: evaluate every N steps and at the end (0: at the end only).
    log_every: fetch training metrics every N steps (the only host sync).
    metric, mode: the eval metric ranking members (early stopping, PBT).
    patience: early-stop a member after this many evaluations without
      improvement (0: off; :class:`purax.hooks.PopulationEarlyStopping`).
    pbt_every: every N steps (a multiple of ``eval_every``), after that
      step's evaluation, run :func:`pbt.exploit_explore` (0: off;
      :class:`purax.hooks.PBT`).
    pbt_fraction: PBT's truncation fraction.
    pbt_names, pbt_bounds: the hyperparameters PBT perturbs and their clip
      intervals (:func:`purax.core.pbt.exploit_explore`'s defaults when None).
    pbt_key: typed key of PBT, folded with the step.
    progress: show a progress bar for the population.

  Returns:
    ``(pop, history)``: records ``{'step', 'train/NAME' | 'eval/NAME': [members]}``
    of numpy arrays, plus ``'pbt/source'`` records when PBT ran.

  Raises:
    ConfigError: an interval out of range, PBT or early stopping without
      ``eval_data``, or ``pbt_every`` not a multiple of ``eval_every``.
  """
  expect(log_every >= 1, 'log_every', '>= 1', log_every, ConfigError)
  for name, value in (('eval_every', eval_every), ('patience', patience),
                      ('pbt_every', pbt_every)):
    expect(value >= 0, name, '>= 0', value, ConfigError)
    expect(value == 0 or name == 'eval_every' or eval_data is not None, name,
           '0 when there is no eval data', value, ConfigError)
  hooks = []
  if patience:
    hooks.append(hooks_lib.PopulationEarlyStopping(metric=metric, mode=mode,
                                                   patience=patience))
  if pbt_every:
    pbt_hook = hooks_lib.PBT(every=pbt_every, metric=metric, mode=mode,
                             fraction=pbt_fraction, key=pbt_key,
                             names=None if pbt_names is None else tuple(pbt_names),
                             bounds=pbt_bounds)
    pbt_hook.check(eval_every)
    hooks.append(pbt_hook)
  plan = plan if plan is not None else plan_lib.Population(task, batch_index)
  return fit(task, pop, train_data, plan=plan,
             eval_data=eval_data, eval_every=eval_every, log_every=log_every,
             progress=progress, hooks=hooks, max_consecutive_skips=None)
