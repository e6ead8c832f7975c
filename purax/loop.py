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

Either way a position counts batches of one size: it records the batches'
leading size (``batch_size``, the global batch), and a run resumed on
batches of another size is refused by name (the same position would name
other examples). A run may resume on another number of devices or another
mesh with the same global batch (``docs/guides/device-counts.md``).
"""

from __future__ import annotations

import collections
import itertools
import warnings
from typing import Any, Iterable, Iterator, Literal

import jax

from purax.core import metrics as metrics_lib
from purax.core import shapes
from purax.core.errors import ConfigError, DataError, expect, expect_kind
from purax.core.population import Population, is_population
from purax.core.state import TrainState
from purax.core.task import Task
from purax.hooks.standard import standard
from purax.hooks.runner import Legacy, _Loop, cadences, is_legacy, name_of
from purax.hooks.record import End
from purax.io.checkpoint import layout
from purax.io.checkpoint.run import Restored
from purax.plan.feed import holds_its_batches as holds_its_batches
from purax.plan.feed import own
from purax.plan.protocol import Plan
from purax.plan.single import SingleDevicePlan


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
  plan = SingleDevicePlan(task) if plan is None else plan
  return metrics_lib.compute(plan.evaluate(state, batches))


def is_random_access(data) -> bool:
  """Whether ``data`` is read by step (``len()`` and ``data[s]``), not iterated."""
  return hasattr(data, '__len__') and hasattr(data, '__getitem__') and not isinstance(
      data, (dict, str, bytes))


class _Source:
  """The batches of steps ``start, start + 1, ...`` and the data position after
  each; :meth:`batch` gives a past step's batch back (for a replay)."""

  def __init__(self, data, start: int, steps: int | None, data_state, iterator_resume: str):
    expect(isinstance(iterator_resume, str) and iterator_resume in ('error', 'warn', 'skip'),
           'iterator_resume',
           "'error', 'warn' or 'skip'", repr(iterator_resume), ConfigError)
    self.positions = collections.deque()   # a stateful iterator's state after each batch read
    self.iterator_state = data_state        # ... after the last batch consumed
    self.batch_size = None                  # the leading size of the batches (the first's)
    self.data, self.kept = data, None
    self.offset = 0                         # batch of state.step s: data[s + offset]
    if is_random_access(data):
      self.num_steps = len(data) if steps is None else steps
      expect(self.num_steps <= len(data), 'steps', f'<= len(train_data) = {len(data)}',
             self.num_steps, ConfigError)
      self.batches = self._indexed(start)
      self.stateful = False
      self.fresh = holds_its_batches(data)
      return
    self.num_steps = steps
    self.fresh = False
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

  def _indexed(self, start):
    for step in range(start, self.num_steps):
      if step + self.offset >= len(self.data):   # skipped data steps: the data runs out first
        return
      yield self.data[step + self.offset]

  def restart(self, start: int, offset: int) -> Iterator:
    """The batches of steps ``start, start + 1, ...`` of a random-access
    source whose batch of step ``s`` is now ``data[s + offset]`` (a rollback:
    :class:`purax.hooks.SpikeRollback`)."""
    expect(is_random_access(self.data), 'train_data', 'a random-access dataset (a rollback '
           'reads past batches again)', type(self.data).__name__, ConfigError)
    self.offset = offset
    self.batches = self._indexed(start)
    return self.batches

  def _iterate(self, start):
    for step in (range(start, self.num_steps) if self.num_steps is not None
                 else itertools.count(start)):
      batch = next(self.iterator, None)
      if batch is None:
        return
      if self.stateful:
        self.positions.append(self.iterator.get_state())
      if self.kept is not None:    # the one copy of it, kept and handed to the step
        batch = own(batch, held=True)
        self.kept.append((step, batch))
      yield batch

  def keep(self, n: int) -> None:
    """Keep the last ``n`` batches of an iterable source, for :meth:`batch`.

    Each is copied once (:func:`purax.plan.feed.own`), and that copy is
    the one the step gets (``fresh``: the plan copies it no more). A random-
    access source needs nothing kept: its batch of step ``s`` is ``data[s]``.
    """
    if not is_random_access(self.data) and n > 0:
      self.kept, self.fresh = collections.deque(maxlen=n), True

  def batch(self, step: int):
    """The batch of ``step`` (host arrays): ``data[step]`` read again from a
    random-access source, else one of the batches :meth:`keep` kept, or None."""
    if is_random_access(self.data):
      return self.data[step + self.offset]
    return next((b for s, b in (self.kept or ()) if s == step), None)

  def advance(self, taken: int) -> None:
    """``taken`` more batches were consumed by a call (a stateful iterator's
    state after the last of them becomes the position's)."""
    if self.stateful:
      for _ in range(taken):
        self.iterator_state = self.positions.popleft()

  def position(self, step: int) -> dict:
    """The data position with ``step`` batches consumed (JSON)."""
    return {'next_step': step,
            **({} if not self.offset else {'offset': self.offset}),
            **({} if self.iterator_state is None else {'iterator': self.iterator_state}),
            **({} if self.batch_size is None else {'batch_size': self.batch_size})}


def leading_size(batch) -> int | None:
  """The leading size of a batch's first array (its global batch size), or None."""
  shapes = [jax.numpy.shape(x) for x in jax.tree.leaves(batch)]
  return int(shapes[0][0]) if shapes and shapes[0] else None


def _check_batch_size(restored: Restored, first) -> None:
  """A resumed position counts batches of the size it was saved with.

  Raises:
    ConfigError: ``first`` (the first batch after resuming) has another leading size.
  """
  recorded = (restored.extra.get('data') or {}).get('batch_size')
  size = leading_size(first)
  expect(recorded is None or size is None or size == recorded, 'train_data batch size',
         f'{recorded} (the global batch of the checkpoint resumed: its data position '
         f'{restored.step} counts batches of {recorded}; resume with the same global batch, '
         'on any number of devices, or start a new run)', size, ConfigError)


#: ``fit``'s keywords before 0.2 that became hooks (:func:`purax.hooks.standard`'s
#: options of the same names): deprecated, mapped onto them until 0.4.
HOOK_KEYWORDS = ('eval_data', 'log_every', 'eval_every', 'writer', 'progress', 'checkpointer',
                 'checkpoint_every', 'should_stop', 'max_consecutive_skips')
#: ``fit``'s keywords before 0.2 that became a :class:`Restored` (what
#: :func:`purax.restore_or_init` returns): deprecated until 0.4.
RESTORED_KEYWORDS = {'train_metrics': 'train_metrics', 'data_state': 'data_state',
                     'hook_state': 'extra', 'hook_arrays': 'hook_arrays'}
#: ``fit``'s keywords before 0.2 that became the plan's
#: (:class:`purax.plan.SingleDevicePlan`'s options): deprecated until 0.4.
PLAN_KEYWORDS = ('prefetch', 'checks')


def _legacy_keywords(state, plan, hooks, legacy: dict, task):
  """``(state, plan, hooks)`` with ``fit``'s keywords before 0.2 mapped onto
  what replaced them, each named in a DeprecationWarning.

  Raises:
    TypeError: a keyword ``fit`` never had.
  """
  unknown = sorted(set(legacy) - set(HOOK_KEYWORDS) - set(RESTORED_KEYWORDS)
                   - set(PLAN_KEYWORDS))
  if unknown:
    raise TypeError(f'fit() got an unexpected keyword argument {unknown[0]!r}')
  def deprecated(names, instead: str) -> None:
    warnings.warn(f'purax: fit({", ".join(f"{k}=" for k in names)}...) is deprecated since '
                  f'0.2 and goes in 0.4: pass {instead} (CHANGELOG.md)', DeprecationWarning,
                  stacklevel=4)

  options = {k: legacy[k] for k in HOOK_KEYWORDS if k in legacy}
  if options:
    deprecated(options, 'hooks=purax.hooks.standard('
               + ', '.join(f'{k}=...' for k in options) + ')')
    expect(hooks is None, 'hooks', "None when fit's deprecated hook keywords are given "
           f'({sorted(options)}: put them in purax.hooks.standard(...) with the others)',
           'a list of hooks', ConfigError)
    hooks = standard(**options)
  restored = {k: legacy[k] for k in RESTORED_KEYWORDS if k in legacy}
  if restored:
    deprecated(restored, 'state=purax.restore_or_init(...) (a Restored brings the metrics '
               "window, the data position and the hooks' state along)")
    if not isinstance(state, Restored):
      state = Restored(state, restored.get('train_metrics'), 0, restored.get('data_state'),
                       {'hooks': restored['hook_state']} if restored.get('hook_state') else {},
                       restored.get('hook_arrays'))
  placement = {k: legacy[k] for k in PLAN_KEYWORDS if k in legacy}
  if placement:
    deprecated(placement, 'plan=purax.plan.SingleDevicePlan(task, '
               + ', '.join(f'{k}=...' for k in placement) + ')')
    expect(plan is None, 'plan', "None when fit's deprecated prefetch/checks are given",
           type(plan).__name__, ConfigError)
    plan = SingleDevicePlan(task, **placement)
  return state, plan, hooks


def fit(task: Task, state: TrainState | Restored, train_data, *, steps: int | None = None,
        plan=None, hooks: Iterable | None = None, steps_per_call: int | Literal['auto'] = 'auto',
        iterator_resume: Literal['error', 'warn', 'skip'] = 'error', **deprecated,
        ) -> tuple[Any, list[dict[str, Any]]]:
  """Trains from ``state.step`` to ``steps``: the plan's step, then the hooks.

  After each call of the plan's jitted step (one step, or ``steps_per_call``
  of them) every due hook runs (:mod:`purax.hooks`: logging, evaluation,
  checkpoints, the stop flag, the progress bar, your own) on a read-only
  :class:`purax.hooks.StepInfo` with the true step number. The run ends
  ``finished`` (the steps reached, or the data ran out), ``early_stopped``
  (a hook said so), ``stopped`` (a signal) or ``failed`` (an error); then
  every hook runs once more with ``info.end`` set (:class:`purax.hooks.End`),
  and ``history.end`` says how it ended.

  Example:
    >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
    ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
    >>> state = task.init(jax.random.key(0), batches[0])
    >>> state, history = purax.fit(task, state, batches, steps=20,
    ...                            hooks=purax.hooks.standard(log_every=10, eval_data=test))
    >>> int(state.step), history[-1]['step']           # history: the logged records
    (20, 20)
    >>> 'train/loss' in history[0] and 'eval/accuracy' in history[-1]
    True

  Args:
    task: the static model/optimizer/loss.
    state: the initial state — a :class:`TrainState`, or what the plan steps
      (a :class:`purax.core.population.Population`) — or a
      :class:`purax.io.checkpoint.run.Restored` (:func:`purax.restore_or_init`),
      which brings its metrics window, data position and hook state along.
      Consumed (donated).
    train_data: random access by step (``train_data[s]`` is the batch of step
      ``s``) or any iterable of batches (the module docstring). Its loader may
      refill a batch's arrays once it has yielded it: ``fit`` trains on a copy
      where a call could still read it (:func:`purax.plan.feed.copy_needed`),
      except for a list or tuple of batches and a source marked
      ``fresh_batches = True`` (:func:`holds_its_batches`).
    steps: the step to train to; default ``len(train_data)`` (random access)
      or until the iterable ends.
    plan: how the state is placed and stepped (:mod:`purax.plan`): default a
      :class:`purax.plan.SingleDevicePlan`; a :func:`purax.parallel.sharded`
      plan (a mesh; each process feeds only its rows of every global batch;
      only process 0 writes) or a :class:`purax.plan.PopulationPlan`.
    hooks: what runs between calls, in their ``order``; default
      :func:`purax.hooks.standard` ``()`` (log every 50 steps, a progress bar,
      the non-finite streak); ``[]``: none.
    steps_per_call: ``k`` steps per call (:class:`purax.plan.SingleDevicePlan`;
      other plans take 1), with exactly the result of ``k`` single steps
      (bitwise on the CPU). Calls end at multiples of ``k``, so every hook's
      ``every`` must be a multiple of ``k``; the steps before the first
      multiple, after the last and in a hook's ``alone`` range run one at a
      time. ``'auto'``: :mod:`purax.plan.auto` chooses (1 on other plans).
    iterator_resume: what resuming (``state.step > 0``) with an iterable that
      cannot be repositioned does: ``'error'`` refuses, ``'warn'`` says so in
      one line and continues on what the iterator yields, ``'skip'`` draws
      and drops ``state.step`` batches first (exact for a deterministic one).
    **deprecated: ``fit``'s keywords before 0.2, mapped onto what replaced
      them with a ``DeprecationWarning`` until 0.4: ``eval_data``,
      ``log_every``, ``eval_every``, ``writer``, ``progress``,
      ``checkpointer``, ``checkpoint_every``, ``should_stop``,
      ``max_consecutive_skips`` (:func:`purax.hooks.standard`'s options);
      ``train_metrics``, ``data_state``, ``hook_state``, ``hook_arrays`` (a
      :class:`Restored`); ``prefetch``, ``checks``
      (:class:`purax.plan.SingleDevicePlan`'s).

  Returns:
    ``(state, history)``: the final state and every record written (a list of
    ``{'step': s, name: number}``; ``history.end``: the :class:`purax.hooks.End`).

  Raises:
    ConfigError: an argument of the wrong kind (named), a state of another
      model than the task's (naming the first parameter path that differs:
      checked against the task's abstract init of the first batch), an
      option out of range, a cadence that is not a multiple of
      ``steps_per_call``, deleted (donated) state arrays, an iterable
      that cannot be repositioned under ``iterator_resume='error'``, or a
      resumed run's batches of another leading size than its checkpoint's
      data position counts (``train_data batch size``).
    DataError, ContractError: a malformed batch or loss (at the first trace).
    NonFiniteError: from :class:`purax.hooks.NonFiniteStreak`.
  """
  expect_kind(task, 'task', Task, 'a purax.Task')
  if deprecated:
    state, plan, hooks = _legacy_keywords(state, plan, hooks, deprecated, task)
  restored = state if isinstance(state, Restored) else Restored(state, None, 0, None, {})
  expect_kind(restored.state, 'state', (TrainState, Population),
              'a TrainState (task.init), a Population or a Restored (purax.restore_or_init)')
  expect(plan is None or isinstance(plan, Plan), 'plan', 'None or a purax.plan.Plan',
         type(plan).__name__, ConfigError)
  expect(hooks is None or (hasattr(hooks, '__iter__') and not isinstance(hooks, (str, dict))),
         'hooks', 'None or a list of hooks (purax.hooks.standard(...))', type(hooks).__name__,
         ConfigError)
  hooks = [Legacy(h) if is_legacy(h) else h for h in (standard() if hooks is None else hooks)]
  hooks = sorted(hooks, key=lambda h: getattr(h, 'order', 0))
  _check(restored.state, train_data, steps, steps_per_call, hooks)
  plan = SingleDevicePlan(task) if plan is None else plan
  start = plan.start_step(restored.state)       # host read before the loop only
  source = _Source(train_data, start, steps, restored.data_state, iterator_resume)
  offset = int((restored.extra.get('data') or {}).get('offset', 0))
  if offset:      # a run that skipped data steps (a rollback): batch of step s is data[s + offset]
    source.restart(start, offset)
  expect(source.num_steps is None or 0 <= start <= source.num_steps, 'state.step',
         f'in [0, {source.num_steps}]', start, ConfigError)
  for hook in hooks:     # an iterable's batches kept for a hook that reads them back
    source.keep(int(getattr(hook, 'keep_batches', 0) or 0))
  host_batches = plan.checked(source.batches)
  first = next(host_batches, None)
  if first is not None:
    _check_model(task, restored.state, first, start)
    _check_batch_size(restored, first)
    source.batch_size = leading_size(first)
  loop = _Loop(task, plan, plan.place(restored.state), restored.train_metrics, start,
               source.num_steps, steps_per_call, hooks, source, source.fresh)
  if first is not None and loop.window is None:
    loop.window = plan.zero_metrics(loop.state, first)
  elif loop.window is not None:       # a restored window (the tree of its checkpoint)
    loop.window = metrics_lib.window(loop.window)
  loop.restore_hooks(restored.hook_states, restored.hook_arrays)
  batches = itertools.chain([first], host_batches) if first is not None else iter(())
  try:
    loop.begin()
    loop.restore_window()
    while loop.end is None:     # (a hook may end the run before its first call)
      for batch, taken in plan.device_batches(batches, loop):
        try:
          loop.state, loop.window = plan.train_step(loop.state, loop.window, batch)
        except DataError as e:    # a batch of another shape, found as the call is traced
          raise DataError(f'train_data batch of step {loop.step}' + (
              f' (or one of the {taken} batches of its call)' if taken > 1 else '') + f': {e}'
                          ) from e
        source.advance(taken)
        loop.after_call(loop.step, taken)
        if loop.end is not None or loop.rewound:
          break
      else:
        if loop.end is None:     # the data ran out: that is the end of training
          loop.finish(End('finished', loop.step, 'the data ran out' if loop.step > start else
                          'nothing left to train'))
      if loop.end is not None or not loop.rewound:
        break
      loop.rewound = False       # a hook rolled the state back: the data restarts there
      if loop.steps_per_call == 'auto' and getattr(plan, 'chosen_steps_per_call', None):
        loop.steps_per_call = plan.chosen_steps_per_call   # chosen once per fit, not again
      batches = plan.checked(source.restart(loop.step, loop.offset))
  except BaseException as e:
    if loop.end is None or loop.end.status != 'failed':
      error = f'{type(e).__name__}: {e}'.strip().rstrip(':')
      loop.finish(End('failed', loop.step, error[:500], error=error[:500]))
    raise
  return loop.state, loop.history


def _check(state, train_data, steps, steps_per_call, hooks) -> None:
  """fit's argument checks, before anything runs (named ConfigErrors)."""
  deleted = [jax.tree_util.keystr(path) for path, x in
             jax.tree_util.tree_flatten_with_path(state)[0]
             if isinstance(x, jax.Array) and x.is_deleted()]
  expect(not deleted, 'state', 'live arrays (fit donates its state: pass a copy, '
         'jax.tree.map(jnp.copy, state), to keep one)',
         f'deleted arrays at {deleted[:3]}', ConfigError)
  expect(steps is None or (isinstance(steps, int) and steps >= 0), 'steps',
         'None or an integer >= 0', steps, ConfigError)
  expect(not isinstance(train_data, dict), 'train_data',
         'batches (a random-access dataset or an iterable of batches), not one batch',
         f'a dict with keys {sorted(train_data)}' if isinstance(train_data, dict) else '',
         ConfigError)
  expect(is_random_access(train_data) or (hasattr(train_data, '__iter__') and not isinstance(
      train_data, (str, bytes))), 'train_data', 'a random-access dataset or an iterable of '
         'batches', type(train_data).__name__, ConfigError)
  k = steps_per_call
  expect(k == 'auto' if isinstance(k, str) else (isinstance(k, int) and k >= 1),
         'steps_per_call',
         "an integer >= 1 or 'auto'", k, ConfigError)
  cadences(hooks)                          # every: None or an integer >= 0
  for hook in hooks:
    expect(callable(hook) and hasattr(hook, 'every'), 'hooks',
           'hooks with every and __call__(info: StepInfo) (purax.hooks)',
           type(hook).__name__, ConfigError)
    for every in (hook.every, getattr(hook, 'log_every', None)):
      expect(k == 'auto' or not every or every % k == 0,
             getattr(hook, 'option', f'{name_of(hook)}.every'),
             f'a multiple of steps_per_call={k} (calls end at multiples of it)', every,
             ConfigError)


def _check_model(task, state, batch, step: int) -> None:
  """The state's params are the task's model's (paths, shapes, dtypes), checked
  against the abstract init of the first batch (cached: free): a state of
  another model is a named ConfigError, not a failure deep in the model; a
  first batch of another per-example shape than the one the params were built
  from (:mod:`purax.core.shapes`) is a DataError naming its field and step."""
  if is_population(state):   # its batches may carry a members axis: the plan checks
    return
  given = layout.signature(state.params)
  expected = layout.signature(task.abstract_state(batch).params)
  if given != expected:
    message = shapes.mismatch(task, state.params, batch)
    if message is not None:
      raise DataError(f'train_data batch of step {step}: {message}')
  layout.check_signature(given, expected, 'fit: state.params', holder='the state',
                         cls=ConfigError, why="a state of another model than the task's")
