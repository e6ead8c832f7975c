"""The loop's side of the hooks: when a hook is due (:func:`due`, the one
cadence rule), the metrics window (:mod:`purax.hooks.window`) read at the
log points, and the one end-of-run
rule (``_Loop.finish``). Private: hooks see a
:class:`purax.hooks.record.StepInfo`, never this."""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
import warnings

from purax.core.errors import ConfigError, expect
from purax.hooks.record import End, Output, StepInfo
from purax.hooks.window import Reader
from purax.io import compile_time
from purax.io.checkpoint.run import checkpoint_extra, checkpoint_tree


def name_of(hook) -> str:
  """A hook's key in a checkpoint's hook state: its ``name``, else its class name."""
  return getattr(hook, 'name', type(hook).__name__)


def due(every: int | None, first: int, last: int, *, evaluated: bool = False,
        at_end: bool = False) -> bool:
  """Whether a hook of cadence ``every`` is due after a call that took
  ``state.step`` from ``first`` to ``last``.

  ``every = n >= 1``: a multiple of ``n`` lies in ``(first, last]`` (the loop
  makes calls end at such multiples, so the hook sees that step); ``0``: the
  step was evaluated; ``None``: after every call. ``at_end``: run whatever
  the cadence (big_vision's ``u.itstime(..., last=True)``).
  """
  if every is None or at_end:
    return True
  if every == 0:
    return evaluated
  return last // every > first // every


def next_due(cadences: list[int], step: int) -> int | None:
  """The first ``state.step`` after ``step`` that is a multiple of one of
  ``cadences`` (each >= 1): a call from ``step`` ending before it leaves every
  hook of these cadences not :func:`due`, one ending at or past it makes one
  due. None without cadences."""
  return min((step // n + 1) * n for n in cadences) if cadences else None


def cadences(hooks) -> list[int]:
  """The step cadences (``every >= 1``, and a :class:`purax.hooks.Log`'s
  ``log_every``) of ``hooks``: the steps that must end a call.

  Raises:
    ConfigError: an ``every`` that is neither None nor an integer >= 0.
  """
  out = []
  for hook in hooks:
    every = getattr(hook, 'every', None)
    expect(every is None or (isinstance(every, int) and not isinstance(every, bool)
                             and every >= 0), f'{name_of(hook)}.every',
           'None (every call) or an integer >= 0', repr(every), ConfigError)
    if every:
      out.append(every)
    if getattr(hook, 'log_every', None):
      out.append(hook.log_every)
  return out


def gcd(values) -> int:
  return math.gcd(*values) if values else 0


def is_legacy(hook) -> bool:
  """Whether ``hook`` is written for the protocol before 0.3:
  ``__call__(step, state, record) -> (state, info)``."""
  try:
    params = [p for p in inspect.signature(hook).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  except (TypeError, ValueError):
    return False
  return len(params) == 3


class History(list):
  """``fit``'s history: every record written (``{'step': s, name: number, ...}``),
  and how the run ended (``end``, a :class:`purax.hooks.record.End`)."""

  end: End | None = None


#: The key of the window reader's state (:class:`purax.hooks.window.Reader`) in
#: a checkpoint's hook state: ``'log'``, where :class:`purax.hooks.Log` kept it
#: before 0.3, so that runs written before resume.
READER_KEY = 'log'


class _Loop:
  """What ``fit`` keeps while it runs (private: hooks get a
  :class:`purax.hooks.record.StepInfo`; plans read ``steps_per_call``,
  ``num_steps``, ``step``, ``cadence``, ``alone`` and ``fresh_batches``).

  Attributes:
    task, plan: what ``fit`` runs.
    state: the current state.
    window: the metrics window (:mod:`purax.hooks.window`; summed on the
      device, read and begun anew by ``reader`` at each log point).
    reader: its :class:`purax.hooks.window.Reader` (from :meth:`begin`).
    step, first, start: ``state.step`` after the last call, before it, and
      when ``fit`` began.
    num_steps: the step the run trains to (None: until the data ends).
    hooks: the hooks, in the order they run.
    history: every record written, and the end (:class:`History`).
    end: how the run ended, once decided (:meth:`finish`).
  """

  def __init__(self, task, plan, state, window, step, num_steps, steps_per_call, hooks,
               source, fresh_batches):
    self.task, self.plan, self.state, self.window = task, plan, state, window
    self.step = self.first = self.start = step
    self.num_steps, self.steps_per_call, self.hooks = num_steps, steps_per_call, hooks
    self.source, self.fresh_batches = source, fresh_batches
    self._cadences = cadences(hooks)
    self.cadence = gcd(self._cadences)
    self._log_every = sorted({h.log_every for h in hooks if getattr(h, 'log_every', None)})
    # Hooks run after every call; a Log (which writes what was written) is
    # not one of them: a call after which no cadence is due writes nothing.
    self._each_call = any(getattr(h, 'every', None) is None and not getattr(h, 'log_every', None)
                          for h in hooks)
    self.upcoming = next_due(self._cadences, step)
    self.ranges = [h.alone for h in hooks if getattr(h, 'alone', None) is not None]
    self.history = History()
    self.end: End | None = None
    self.record: dict = {}
    self.histograms: dict = {}
    self._window_host = None
    self._ran: set[int] = set()        # ids of the hooks that ran at this step
    self.hook_s, self.began = 0.0, None
    self.hook_compile_s, self.began_compile = 0.0, None
    self.reader: Reader | None = None
    # For hooks of the protocol before 0.3 (their start(loop) and end(loop) read these).
    self.stop = self.at_end = self.failed = False
    self.rollback = None               # (state, step, offset) a hook asked for (rewind)
    self.rewound = False               # the state went back: fit restarts the data
    self._new_record = False
    self.offset = getattr(source, 'offset', 0)

  # -- cadence --

  def hooks_due(self) -> bool:
    """Whether a hook is due after the call that ended at ``step``: one that
    runs after every call, or a step cadence reached (``upcoming``). Cheap: a
    call with none due does nothing else."""
    return self._each_call or (self.upcoming is not None and self.step >= self.upcoming)

  def alone(self, step: int) -> bool:
    """Whether the update from ``state.step == step`` must run in a call of its own."""
    return any(step in r for r in self.ranges)

  @property
  def position(self) -> dict:
    """The data position after the last consumed batch (JSON)."""
    return self.source.position(self.step)

  # -- timing --

  def hook_seconds(self) -> float:
    """Seconds spent in the hooks since ``fit`` started, up to now."""
    return self.hook_s + (time.perf_counter() - self.began if self.began is not None else 0.0)

  def hook_compile_seconds(self) -> float:
    """Compilation seconds spent inside the hooks since ``fit`` started, up to now."""
    return self.hook_compile_s + (compile_time.seconds() - self.began_compile
                                  if self.began_compile is not None else 0.0)

  def _timed(self, body) -> None:
    self.began, self.began_compile = time.perf_counter(), compile_time.seconds()
    try:
      body()
    finally:
      self.hook_s, self.began = self.hook_seconds(), None
      self.hook_compile_s, self.began_compile = self.hook_compile_seconds(), None

  # -- the rounds --

  def begin(self) -> None:
    """Before the first call: the window's clock starts, and each hook that runs
    after every call (``every=None``) is called once (``first == step``); one
    that asks to stop there ends the run with no step taken (:meth:`finish`)."""
    self.reader = Reader(self)
    for hook in self.hooks:
      if hasattr(hook, 'start_legacy'):
        hook.start_legacy(self)
    self._timed(lambda: [self._call(h, forced=False) for h in self.hooks
                         if getattr(h, 'every', None) is None])
    self._ran.clear()
    if self.end is not None:      # a hook ended the run before its first call
      self.finish(self.end)

  def after_call(self, first: int, taken: int) -> None:
    """After a call that took ``state.step`` from ``first`` by ``taken``: the due
    hooks in order (a hook asking to stop ends the round), then, when the run
    ended, the final round (:meth:`finish`)."""
    self.first, self.step = first, first + taken
    self.record, self.histograms, self._window_host = {}, {}, None
    self._ran.clear()
    if self.num_steps is not None and self.step >= self.num_steps:
      self.finish(End('finished', self.step, f'reached step {self.step}'))
      return
    if not self.hooks_due():
      return
    self._timed(self._round)
    if self.rollback is not None and self.end is None:
      self.state, step, self.offset = self.rollback
      self.first = self.step = step
      self.rewound = self._new_record = True   # the replayed steps get records of their own
      self.reader.clock = self.reader._clock(step)   # steps_per_sec counts from here
      for hook in self.hooks:            # e.g. a Checkpoint drops the abandoned steps' saves
        if callable(getattr(hook, 'rewound', None)):
          hook.rewound(step)
    self.rollback = None
    self.upcoming = next_due(self._cadences, self.step)
    if self.end is not None:
      self.finish(self.end)

  def rewind(self, state, step: int, offset: int) -> None:
    """Asks that training go on from ``state`` (whose ``step`` is ``step``, a
    past step) with the batch of step ``s`` read from ``data[s + offset]``
    (random-access data only): applied after this round, whose remaining
    hooks on a step cadence (a checkpoint, a stop) do not run; those that run
    after every call (:class:`purax.hooks.Log`) still do, at this step.
    Used by :class:`purax.hooks.SpikeRollback`."""
    self.rollback = (state, int(step), int(offset))

  def _round(self) -> None:
    if self._log_point():
      self._read_window()
    for hook in self.hooks:
      every = getattr(hook, 'every', None)
      if self.rollback is not None and every is not None:
        continue
      if every is None or due(every, self.first, self.step,
                              evaluated=every == 0 and self._evaluated()):
        self._call(hook, forced=False)
        if self.end is not None:
          return

  def finish(self, end: End) -> None:
    """The one end-of-run rule: once the run has ended (``end``), every hook
    runs once more at this step with ``info.end`` set (levanter's
    ``run_hooks(info, force=True)``), ``info.forced`` where its cadence did not
    call it here or it already ran here. A finished or early-stopped run first
    reads its last metrics window (when steps remain unlogged); a stopped one
    keeps it for the resume; a failed one reads nothing. Each hook decides
    what its final call does (:class:`purax.hooks.Checkpoint` saves,
    :class:`purax.hooks.Evaluate` evaluates an unevaluated finished run,
    :class:`purax.hooks.Log` writes the end); errors of a failed run's final
    calls are suppressed, the run's own error goes on."""
    self.end = self.history.end = dataclasses.replace(end, step=self.step)
    self.stop, self.at_end = end.status != 'finished', end.done
    self.failed = end.status == 'failed'

    def final():
      if (end.done and self._window_host is None and self.step > self.start
          and (self.reader.logged is None or self.reader.logged < self.step)
          and self._log_every):
        self._read_window()
      for hook in self.hooks:
        cadence = getattr(hook, 'every', None)
        on_cadence = self.step > self.first and due(
            cadence, self.first, self.step, evaluated=cadence == 0 and self._evaluated())
        forced = id(hook) in self._ran or not on_cadence
        if self.failed:
          try:
            self._call(hook, forced=True)
          except Exception:   # the run's own error is the one to see
            pass
        else:
          self._call(hook, forced=forced)
    self._timed(final)

  # -- one hook --

  def _evaluated(self) -> bool:
    return any(k.startswith('eval/') for k in self.record)

  def _log_point(self) -> bool:
    return any(self.step // n > self.first // n for n in self._log_every)

  def _read_window(self) -> None:
    numbers, self._window_host = self.reader.read(self.step)
    self.write(numbers)

  def info(self, forced: bool) -> StepInfo:
    return StepInfo(first=self.first, step=self.step, state=self.state, metrics=self.record,
                    start=self.start, num_steps=self.num_steps, end=self.end, forced=forced,
                    plan=self.plan, window=self._window_host, histograms=self.histograms,
                    _run=self)

  def _call(self, hook, *, forced: bool) -> None:
    """Calls ``hook`` with this step's record and applies its :class:`Output`."""
    self._ran.add(id(hook))
    out = hook(self.info(forced))
    if out is None:
      return
    expect(isinstance(out, Output), f'{name_of(hook)} return value',
           'None or a purax.hooks.Output', type(out).__name__, ConfigError)
    if out.state is not None:
      self.state = out.state
    if out.histograms:
      self.histograms.update(out.histograms)
    self.write(dict(out.metrics))
    if out.stop is not None and self.end is None:
      self.end = out.stop

  def write(self, numbers: dict) -> None:
    """Adds ``numbers`` to this step's record and the history."""
    if not numbers:
      return
    self.record.update(numbers)
    if self.history and self.history[-1]['step'] == self.step and not self._new_record:
      self.history[-1].update(numbers)
    else:
      self.history.append({'step': self.step, **numbers})
      self._new_record = False

  # -- checkpoints --

  def checkpoint(self, info: StepInfo) -> tuple[dict, dict]:
    """``(tree, extra)`` of this step (:meth:`StepInfo.checkpoint`)."""
    tree = checkpoint_tree(self.state, self.window, self.hook_arrays())
    extra = checkpoint_extra(self.position, self.hook_states())
    if self.end is not None and self.end.status != 'failed':
      extra['end'] = self.end.as_dict()
    return tree, extra

  def hook_states(self) -> dict:
    """``{name: state_dict()}`` of the hooks that have one, and the window reader's (JSON)."""
    states = {READER_KEY: self.reader.state_dict()} if self.reader is not None else {}
    states.update({name_of(h): h.state_dict() for h in self.hooks
                   if callable(getattr(h, 'state_dict', None))})
    return states

  def hook_arrays(self) -> dict:
    """``{name: arrays}`` of the hooks with array state (``init_arrays``)."""
    return {name_of(h): h.arrays for h in self.hooks if callable(getattr(h, 'init_arrays', None))}

  def restore_hooks(self, states: dict | None, arrays: dict | None) -> None:
    """Loads the hooks' saved state (JSON and arrays), or starts their arrays."""
    states = states or {}
    for hook in self.hooks:
      saved = states.get(name_of(hook))
      if saved is not None and callable(getattr(hook, 'load_state_dict', None)):
        hook.load_state_dict(saved)
      if callable(getattr(hook, 'init_arrays', None)):
        saved = (arrays or {}).get(name_of(hook))
        hook.arrays = hook.init_arrays(self.state) if saved is None else saved
    self._saved_reader = states.get(READER_KEY)

  def restore_window(self) -> None:
    """Loads the window reader's saved state (which hyperparameters varied)."""
    if getattr(self, '_saved_reader', None) is not None and self.reader is not None:
      self.reader.load_state_dict(self._saved_reader)

  @property
  def metrics(self):
    """The metrics window under its name before 0.3 (for hooks of the protocol
    before 0.3, which were handed this loop): :attr:`window`."""
    return self.window


class Legacy:
  """A hook of the protocol before 0.3 (``__call__(step, state, record) ->
  (state, info)``, ``at_end``, ``start(loop)``, ``end(loop)``), run on this
  one: deprecated, working until 0.4."""

  def __init__(self, hook):
    self.hook = hook
    warnings.warn(
        f'purax: the hook {type(hook).__name__} uses the protocol before 0.3 '
        '(__call__(step, state, record) -> (state, info), start(loop), end(loop)); write '
        '__call__(info: purax.hooks.StepInfo) -> purax.hooks.Output | None instead '
        '(CHANGELOG.md, 0.3); the old protocol works until 0.4', DeprecationWarning,
        stacklevel=4)
    for attr in ('every', 'order', 'name', 'option', 'alone', 'log_every'):
      if hasattr(hook, attr):
        setattr(self, attr, getattr(hook, attr))
    self.every = getattr(hook, 'every', None)
    self.name = name_of(hook)
    if callable(getattr(hook, 'state_dict', None)):
      self.state_dict = hook.state_dict
      self.load_state_dict = hook.load_state_dict
    if callable(getattr(hook, 'init_arrays', None)):
      self.init_arrays = hook.init_arrays

  @property
  def arrays(self):
    return self.hook.arrays

  @arrays.setter
  def arrays(self, value):
    self.hook.arrays = value

  def start_legacy(self, loop) -> None:
    if callable(getattr(self.hook, 'start', None)):
      self.hook.start(loop)

  def __call__(self, info: StepInfo):
    loop = info._run
    if info.first == info.step and info.end is None:
      return None              # the old protocol had no call before the first step
    ran_here = getattr(self, 'ran', None) == info.step
    run = (not info.forced) or (info.end is not None and info.end.status == 'finished'
                                and getattr(self.hook, 'at_end', False) and not ran_here)
    out = None
    if run:
      self.ran = info.step
      state, numbers = self.hook(info.step, info.state, dict(info.metrics))
      numbers = dict(numbers or {})
      stop = numbers.pop('stop', False)
      histograms = numbers.pop('histograms', None)
      out = Output(state=state, metrics=numbers, histograms=histograms,
                   stop=End('early_stopped', info.step, f'{self.name} asked to stop')
                   if stop else None)
    if info.end is not None and callable(getattr(self.hook, 'end', None)):
      if out is not None and out.state is not None:   # end(loop) saw this step's state
        loop.state = out.state
      self.hook.end(loop)
    return out
