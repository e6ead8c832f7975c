"""What :func:`purax.fit` hands its hooks (:class:`Loop`), and when a hook is
due (:func:`due`): the one cadence rule of the loop."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax

from purax.core.errors import ConfigError, expect
from purax.io import compile_time


def name_of(hook) -> str:
  """A hook's key in a checkpoint's hook state: its ``name``, else its class name."""
  return getattr(hook, 'name', type(hook).__name__)


def due(every: int | None, first: int, last: int, *, evaluated: bool = False,
        at_end: bool = False) -> bool:
  """Whether a hook of cadence ``every`` is due after a call that took
  ``state.step`` from ``first`` to ``last``.

  ``every = n >= 1``: a multiple of ``n`` lies in ``(first, last]`` (the loop
  makes calls end at such multiples, so the hook sees that step); ``0``: the
  step was evaluated; ``None``: after every call. ``at_end``: the call ended
  the run and the hook asks to run there whatever its cadence (big_vision's
  ``u.itstime(..., last=True)``).
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
  """The step cadences (``every >= 1``) of ``hooks``: the steps that must end a call.

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
  return out


@dataclasses.dataclass(eq=False)
class Loop:
  """The loop's state, as ``fit`` hands it to the hooks' ``start(loop)`` and
  ``end(loop)`` (and as built-in hooks keep it to read in ``__call__``).

  Attributes:
    task, plan: what ``fit`` runs.
    state: the current state (a hook may replace it by returning a new one).
    metrics: the running training-metrics window (summed on the device).
    step: ``state.step`` after the last call (a Python int).
    start: ``state.step`` when ``fit`` started.
    first: ``state.step`` before the last call.
    num_steps: the step the run trains to (None: until the data ends).
    steps_per_call: ``fit``'s ``steps_per_call``.
    cadence: the gcd of the hooks' step cadences (0: none).
    hooks: the hooks, in the order they run.
    record: what was written at this step so far (``{name: number}``).
    history: every record written (``{'step': s, name: number, ...}``).
    writers: where records go (``write_scalars(step, scalars)``; only
      process 0 writes).
    stop: a hook asked to stop after this step.
    at_end: this call ended the run (its last step, or the data ran out, or
      a plan-level finish).
    failed: the loop is ending with an exception (for ``end``).
    hook_s: seconds spent in the hooks' runs that ended (not training time).
    began: ``time.perf_counter()`` when the hooks of this step began (None
      outside them).
    hook_compile_s, began_compile: the same for the compilation seconds
      (:mod:`purax.io.compile_time`) spent inside the hooks (an evaluation
      step's first compilation), so that compilation outside them is the
      training programs'.
    ranges: ranges of ``state.step`` whose updates must run one per call
      (the hooks' ``alone``).
    fresh_batches: the data's batches need no private copy
      (:func:`purax.loop.holds_its_batches`).
    source: the training data as ``fit`` reads it: ``source.batch(step)`` is a
      past step's host batch (read again from a random-access source; from
      an iterable only when kept, ``source.keep(n)`` in a hook's ``start``);
      ``source.position(step)`` the data position (:attr:`position`).
    upcoming: the first step at which a hook with a step cadence is due
      (:func:`next_due`; None: no such hook).
  """

  task: Any
  plan: Any
  state: Any
  metrics: Any
  step: int
  num_steps: int | None
  steps_per_call: Any
  cadence: int
  hooks: list
  start: int = 0
  first: int = 0
  record: dict = dataclasses.field(default_factory=dict)
  history: list = dataclasses.field(default_factory=list)
  writers: list = dataclasses.field(default_factory=list)
  stop: bool = False
  at_end: bool = False
  failed: bool = False
  hook_s: float = 0.0
  began: float | None = None
  hook_compile_s: float = 0.0
  began_compile: float | None = None
  ranges: list = dataclasses.field(default_factory=list)
  fresh_batches: bool = False
  source: Any = None
  upcoming: int | None = None

  def __post_init__(self):
    self._cadences = cadences(self.hooks)
    self._each_call = any(getattr(h, 'every', None) is None for h in self.hooks)
    self.upcoming = next_due(self._cadences, self.step)

  @property
  def position(self) -> dict:
    """The data position after the last consumed batch (JSON:
    ``{'next_step': int, 'iterator': state, 'batch_size': int}``)."""
    return self.source.position(self.step)

  def hooks_due(self) -> bool:
    """Whether a hook is due after the call that ended at ``step``:
    one that runs after every call, the end, or a step cadence reached
    (``upcoming``). Cheap: a call with none due does nothing else."""
    return (self._each_call or self.at_end
            or (self.upcoming is not None and self.step >= self.upcoming))

  def run_due_hooks(self) -> None:
    """Runs every hook :func:`due` after the call that took ``state.step``
    from ``first`` to ``step``, in order, into ``record``,
    timing them (``hook_s``, ``hook_compile_s``)."""
    self.began, self.began_compile = time.perf_counter(), compile_time.seconds()
    for hook in self.hooks:
      if due(hook.every, self.first, self.step, at_end=self.at_end and hook.at_end,
             evaluated=hook.every == 0 and self.evaluated):   # read only where it decides
        self.run_hook(hook)
    self.hook_s, self.began = self.hook_seconds(), None
    self.hook_compile_s, self.began_compile = self.hook_compile_seconds(), None
    self.upcoming = next_due(self._cadences, self.step)

  def hook_seconds(self) -> float:
    """Seconds spent in the hooks since ``fit`` started, up to now."""
    return self.hook_s + (time.perf_counter() - self.began if self.began is not None else 0.0)

  def hook_compile_seconds(self) -> float:
    """Compilation seconds spent inside the hooks since ``fit`` started, up to now."""
    return self.hook_compile_s + (compile_time.seconds() - self.began_compile
                                  if self.began_compile is not None else 0.0)

  def alone(self, step: int) -> bool:
    """Whether the update from ``state.step == step`` must run in a call of its own."""
    return any(step in r for r in self.ranges)

  @property
  def evaluated(self) -> bool:
    return any(k.startswith('eval/') for k in self.record)

  def write(self, scalars: dict) -> None:
    """Writes ``scalars`` at ``step``: the record, the history, the writers."""
    if not scalars:
      return
    self.record.update(scalars)
    self.history.append({'step': self.step, **scalars})
    if jax.process_index() == 0:
      for writer in self.writers:
        writer.write_scalars(self.step, scalars)

  def write_histograms(self, histograms: dict) -> None:
    if jax.process_index() == 0:
      for writer in self.writers:
        if hasattr(writer, 'write_histograms'):
          writer.write_histograms(self.step, histograms)

  def run_hook(self, hook) -> None:
    """Calls ``hook(step, state, record)`` and applies what it returns."""
    self.state, info = hook(self.step, self.state, self.record)
    info = dict(info or {})
    self.stop = bool(info.pop('stop', False)) or self.stop
    histograms = info.pop('histograms', None)
    if histograms:
      self.write_histograms(histograms)
    self.write(info)

  def hook_states(self) -> dict:
    """``{name: state_dict()}`` of the hooks that have one (JSON)."""
    return {name_of(h): h.state_dict() for h in self.hooks if hasattr(h, 'state_dict')}

  def hook_arrays(self) -> dict:
    """``{name: arrays}`` of the hooks with array state (``init_arrays``)."""
    return {name_of(h): h.arrays for h in self.hooks if callable(getattr(h, 'init_arrays', None))}

  def restore_hooks(self, states: dict | None, arrays: dict | None) -> None:
    """Loads the hooks' saved state (JSON and arrays), or starts their arrays."""
    for hook in self.hooks:
      saved = (states or {}).get(name_of(hook))
      if saved is not None and hasattr(hook, 'load_state_dict'):
        hook.load_state_dict(saved)
      if callable(getattr(hook, 'init_arrays', None)):
        saved = (arrays or {}).get(name_of(hook))
        hook.arrays = hook.init_arrays(self.state) if saved is None else saved


def gcd(values) -> int:
  return math.gcd(*values) if values else 0
