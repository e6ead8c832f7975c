"""A run on a time budget: :class:`TimeBudget` plans how many steps fit in a
wall-clock budget from the measured step time, and ends the run ``finished``
(reason :data:`REASON`) early enough that its final evaluation and checkpoint
end inside it.

The plan, in one place:

1. before the first call: the clock of the budget is already running (it
   started with the command, ``started``); a budget spent by start-up alone
   is refused (:class:`purax.ConfigError` naming ``time_budget``);
2. the first call compiles the step: its compilation seconds
   (:mod:`purax.io.compile_time`) are kept out of the step time and stated
   (``compile_s``); a budget that cannot hold what has run, one more step and
   the final evaluation and save is refused there;
3. ``probe_steps`` calls are timed with a host sync after each (the only
   syncs this hook adds); the evaluation is run once to time it (its
   program is then compiled for the final one); the steps are planned:
   ``planned = step + floor((deadline - now - reserve) / step_s)``, with
   ``reserve`` the timed evaluation and ``tail_s`` (the final save and the
   process's exit);
4. at each log point (the loop has synced there) the step time is measured
   anew (the slower of the steps since the first plan and of those since the
   last log point, their compilation left out), and the plan redone from the
   clock: an estimate that was wrong ends the run there.

The budget is each invocation's: a resumed run plans its steps in its own
budget from its own clock (nothing of the plan is checkpointed).

The rule of step 3 is :func:`plan_steps`; the steps 1-4 are also methods
(:meth:`TimeBudget.start`, ``compiled_call``, ``probed``, ``first_plan``,
``replan``), which ``purax tune lr --time-budget`` (a loop that is not
:func:`purax.fit`, :mod:`purax.app.tune`) drives the same way.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Callable, Iterable

import jax

from purax.core.errors import ConfigError, expect
from purax.hooks.record import End, Output
from purax.io import compile_time

#: The reason of a run that the budget ended (``purax.hooks.End.reason`` starts with it).
REASON = 'time budget'

#: Units of :func:`parse_duration`, in seconds.
UNITS = {'s': 1.0, 'm': 60.0, 'h': 3600.0}


def parse_duration(text: str, field: str = 'time_budget') -> float:
  """Seconds of a duration written ``60s``, ``5m``, ``1.5h`` (a number and one
  unit of :data:`UNITS`).

  Raises:
    ConfigError: naming ``field``, when ``text`` is not such a duration or
      is not positive and finite.
  """
  match = re.fullmatch(r'\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh])\s*', str(text))
  expect(match is not None, field, "a duration such as '60s', '5m' or '1h'", repr(text),
         ConfigError)
  seconds = float(match.group(1)) * UNITS[match.group(2)]
  expect(0 < seconds < math.inf, field, 'a duration > 0', repr(text), ConfigError)
  return seconds


def plan_steps(step: int, now: float, deadline: float, step_s: float, reserve_s: float) -> int:
  """The step a run at ``step`` at time ``now`` (s, the budget's clock) is
  planned to end at: ``step + floor((deadline - now - reserve_s) / step_s)``,
  never below ``step``: the steps of ``step_s`` seconds that fit before
  ``deadline`` once ``reserve_s`` (the end: evaluation, report, save) is kept.
  The one planning rule of :class:`TimeBudget` and of ``purax tune lr
  --time-budget`` (:mod:`purax.app.tune`)."""
  return step + max(math.floor((deadline - now - reserve_s) / step_s), 0)


def ended_by_budget(end: End | None) -> bool:
  """Whether ``end`` is a run that its time budget ended."""
  return end is not None and end.status == 'finished' and end.reason.startswith(REASON)


class TimeBudget:
  """Ends a run ``finished`` (reason ``'time budget ...'``) when its budget
  says so (the module docstring: measured, planned, re-checked at log points).

  Attributes:
    seconds: the budget (s), from ``started``.
    started: the budget's start on ``clock`` (default: when the hook is made;
      the command line passes the process's start).
    eval_data: the final evaluation's batches, timed once to reserve their
      time (None: no evaluation to reserve).
    tail_s: seconds reserved after the evaluation: the final checkpoint and
      the process's exit (default ``max(2, 3% of seconds)``).
    probe_steps: steps timed one call at a time after the compiling call.
    last_step: the step the run ends at however much budget is left, e.g.
      the learning-rate schedule's end (``purax train --time-budget`` passes
      its ``--decay-steps``, planned before it starts,
      :mod:`purax.app.calibrate`); a run resumed at or past it trains
      nothing. None: no such end.
    clock: ``() -> seconds`` (``time.monotonic``).
    compiled: ``() -> seconds`` this thread has compiled
      (:func:`purax.io.compile_time.seconds`).
    compile_s: the first call's compilation (s), once known.
    step_s: the measured seconds per step (compilation left out), once known.
    eval_s: the timed evaluation (s), once known.
    planned: the step the run is planned to end at (None until planned).
    plans: ``[(step, step_s, planned)]``: every plan made, in order (the
      first and the newest are reported).
  """

  order, every, name = -20, None, 'time_budget'

  def __init__(self, seconds: float, *, started: float | None = None,
               eval_data: Iterable | None = None, tail_s: float | None = None,
               probe_steps: int = 3, last_step: int | None = None,
               clock: Callable[[], float] = time.monotonic,
               compiled: Callable[[], float] = compile_time.seconds):
    expect(isinstance(seconds, (int, float)) and 0 < seconds < math.inf, 'time_budget',
           'seconds > 0', seconds, ConfigError)
    expect(isinstance(probe_steps, int) and probe_steps >= 1, 'probe_steps', '>= 1',
           probe_steps, ConfigError)
    expect(last_step is None or (isinstance(last_step, int) and last_step >= 1), 'last_step',
           'None or an integer >= 1', last_step, ConfigError)
    self.last_step = last_step
    self.seconds, self.clock, self.compiled = float(seconds), clock, compiled
    self.started = clock() if started is None else started
    self.deadline = self.started + self.seconds
    self.eval_data, self.probe_steps = eval_data, probe_steps
    self.tail_s = max(2.0, 0.03 * self.seconds) if tail_s is None else float(tail_s)
    self.compile_s = self.step_s = self.eval_s = self.planned = None
    self.plans: list[tuple[int, float, int]] = []
    self._mark: tuple[float, int, float] | None = None   # (time, step, compile seconds)
    self._last: tuple[float, int, float] | None = None
    self._probe_from: tuple[float, int] | None = None

  # -- what it measured --

  @property
  def reserve_s(self) -> float:
    """Seconds kept for the end: the timed evaluation and ``tail_s``."""
    return (self.eval_s or 0.0) + self.tail_s

  def used(self) -> float:
    """Seconds of the budget used so far."""
    return self.clock() - self.started

  def report(self) -> dict[str, Any]:
    """What the budget measured and planned (JSON, for a verdict)."""
    return {'budget_s': self.seconds, 'compile_s': self.compile_s, 'step_s': self.step_s,
            'eval_s': self.eval_s, 'reserve_s': self.reserve_s, 'planned_step': self.planned,
            'replans': max(len(self.plans) - 1, 0),
            'plans': [{'step': s, 'step_s': t, 'planned_step': p}
                      for s, t, p in (self.plans[:1] + self.plans[1:][-1:])]}

  # -- the hook --

  def __call__(self, info) -> Output | None:
    if info.end is not None:
      return None
    if info.first == info.step:               # before the first call
      if self.last_step is not None and info.step >= self.last_step:
        return Output(stop=End('finished', info.step, f'{REASON} of {self.seconds:g} s: '
                               f'step {info.step} is its last step; nothing to train'))
      self.start(info.step)
      return None
    if self.compile_s is None:                # the first call: it compiled
      jax.block_until_ready(info.state)
      now, first_s = self.compiled_call(info.step)
      self.expect_room(now, 1, first_s)
      return None
    if self.planned is None:                  # probing
      jax.block_until_ready(info.state)
      if not self.probed(info.step):
        return None
      now = self.clock()
      self.step_s = (now - self._probe_from[0]) / (info.step - self._probe_from[1])
      if self.eval_data is not None:          # timed once; its program is kept for the end
        before = self.compiled()
        jax.block_until_ready(info.plan.evaluate(info.state, self.eval_data))
        after = self.clock()
        # The final evaluation runs the program compiled here: its run is what it costs.
        self.eval_s = max(after - now - (self.compiled() - before), 0.0) * 1.5
        now = after
      self._mark = self._last = (now, info.step, self.compiled())
      return self._plan(info.step, now)
    if 'steps_per_sec' in info.metrics:       # a log point: the loop synced
      self.replan(info.step)
    return self._stop(info.step) if info.step >= self.planned else None

  @staticmethod
  def _rate(mark: tuple, now: float, step: int, compiled: float) -> float:
    """Seconds a step since ``mark`` (its compilation left out)."""
    t, s, c = mark
    return max(now - t - (compiled - c), 1e-9) / (step - s)

  def _plan(self, step: int, now: float) -> Output | None:
    self.plan(step, now)
    return self._stop(step) if step >= self.planned else None

  # -- the parts a loop other than purax.fit uses (purax tune lr --time-budget) --

  def expect_started(self, now: float) -> None:
    """Raises :class:`purax.ConfigError` naming ``time_budget`` when at
    ``now`` the start-up has left no room for ``reserve_s``."""
    expect(now + self.reserve_s < self.deadline, 'time_budget',
           f'more than the {now - self.started:.1f} s the start-up took and the '
           f'{self.tail_s:.1f} s kept for the end', f'{self.seconds:g} s', ConfigError)

  def expect_room(self, now: float, steps: int, step_s: float, *, what: str = 'one step',
                  kept: str = 'the final evaluation and save',
                  error: type[ConfigError] = ConfigError) -> None:
    """Raises ``error`` naming ``time_budget`` when at ``now`` (after the
    compilation, ``compile_s``) ``steps`` more steps of ``step_s`` seconds
    and ``reserve_s`` do not fit in the budget; ``what`` names the steps
    and ``kept`` the reserve in the message."""
    need = now - self.started + steps * step_s + self.reserve_s
    expect(now + steps * step_s + self.reserve_s < self.deadline, 'time_budget',
           f'at least {need:.1f} s ({now - self.started:.1f} s of start-up and compilation, '
           f'the compilation {self.compile_s:.1f} s of it; {what}; and {self.reserve_s:.1f} s '
           f'kept for {kept})', f'{self.seconds:g} s', error)

  def start(self, step: int) -> None:
    """Before the first call, at ``step``: checks the start-up
    (:meth:`expect_started`) and marks the clock."""
    now = self.clock()
    self.expect_started(now)
    self._mark = (now, step, self.compiled())

  def compiled_call(self, step: int) -> tuple[float, float]:
    """After the first call (synced), at ``step``: keeps its compilation
    (``compile_s``) and starts the probe; returns ``(now, seconds a step
    of that call, its compilation left out)``."""
    now, compiled = self.clock(), self.compiled()
    self.compile_s = compiled - self._mark[2]
    self._probe_from = (now, step)
    return now, max(now - self._mark[0] - self.compile_s, 0.0) / max(step - self._mark[1], 1)

  def probed(self, step: int) -> bool:
    """Whether the probe (``probe_steps`` synced steps after the first
    call) is done at ``step``."""
    return step - self._probe_from[1] >= self.probe_steps

  def first_plan(self, step: int) -> int:
    """After the probe (synced, nothing else timed), at ``step``: measures
    ``step_s`` and plans (:meth:`plan`); returns the planned step."""
    now = self.clock()
    self.step_s = (now - self._probe_from[0]) / (step - self._probe_from[1])
    self._mark = self._last = (now, step, self.compiled())
    return self.plan(step, now)

  def replan(self, step: int) -> int:
    """At a synced ``step`` after the first plan: the step time measured anew
    (the slower of the steps since the first plan and of those since the last
    re-plan: a step that slowed down counts at once; compilation left out)
    and the plan redone from the clock; returns the planned step."""
    now, compiled = self.clock(), self.compiled()
    self.step_s = max([self._rate(mark, now, step, compiled)
                       for mark in (self._mark, self._last) if step > mark[1]]
                      or [self.step_s])
    self._last = (now, step, compiled)
    return self.plan(step, now)

  def plan(self, step: int, now: float) -> int:
    """Plans the step to end at from ``step`` at ``now`` with ``step_s``
    (:func:`plan_steps`, at most ``last_step``), records it in ``plans`` and
    returns it."""
    self.planned = plan_steps(step, now, self.deadline, self.step_s, self.reserve_s)
    if self.last_step is not None:
      self.planned = min(self.planned, max(self.last_step, step))
    self.plans.append((step, self.step_s, self.planned))
    return self.planned

  def _stop(self, step: int) -> Output:
    at_end = ' (its last step)' if step == self.last_step else ''
    return Output(stop=End('finished', step, f'{REASON} of {self.seconds:g} s: {step} steps'
                           f'{at_end} at {self.step_s * 1e3:.3g} ms a step (compilation '
                           f'{self.compile_s:.1f} s left out)'))
