"""A ``purax train --time-budget`` run planned before it starts, so that its
learning-rate schedule ends with the budget.

A schedule spans ``--decay-steps`` (unset: ``--steps``); a run that its
budget ends first would stop mid-decay, at a rate far from the schedule's
end. :func:`calibrated` measures the step on a throwaway copy of the fresh
state with the run's own :class:`purax.hooks.TimeBudget` (the compiling
call, the timed steps, the timed evaluation: its steps 1-3), lets the steps
run unsynced for :data:`WINDOW` of the budget (0.5 to 5 s) and times them (adding a
step's share of the evaluation every ``--eval-every`` steps), then plans the
run's steps from step 0 with the same rule (:func:`purax.hooks.time_budget.plan_steps`),
counting again all it compiled (the schedule is part of the step's program;
the evaluation's program is the new task's) and the job's rebuilding;
``--decay-steps`` becomes that plan when it is below ``--steps``. When
compiling again would cost more than :data:`PAYS` of the planned steps, the
calibration ends at its first plan and nothing changes: the run trains with
the programs already compiled, its schedule spanning ``--steps``. ``config.json`` records it, so a resumed run follows the
same schedule, and the budget's hook ends the run at it (``last_step``)
however much budget is left; a slower run than measured still ends inside
its budget, before the schedule's end (its verdict says at which step).

A run that sets ``--decay-steps`` itself, or is resumed, is not calibrated.
"""

from __future__ import annotations

import dataclasses

import jax

from purax.app.config import TrainConfig
from purax.hooks import time_budget as budget_lib
from purax.hooks.record import End, Output
from purax.loop import fit


#: The share of the budget the calibration runs steps unsynced after the
#: budget's first plan (within :data:`MIN_WINDOW_S`, :data:`MAX_WINDOW_S`): the steps one at a
#: time with a sync after each (the plan's probe) overstate a small step's
#: time, as the host's dispatch no longer overlaps the device's work.
WINDOW = 0.02
#: The calibration's shortest and longest unsynced window (s).
MIN_WINDOW_S, MAX_WINDOW_S = 0.5, 5.0
#: The largest share of the planned steps that compiling again may cost (its
#: seconds over the step's): beyond it the schedule is not planned (it spans
#: ``--steps``, as without planning) and the run keeps the programs the
#: calibration compiled, losing only the probe's few steps. The planned
#: decay changes the last part of a schedule; a model that compiles for many
#: of its steps (a language model on a short budget) loses more to the
#: second compilation than the decay brings (benchmarks/README.md).
PAYS = 0.10


class _Window:
  """After the budget's first plan: ends the calibration at once when
  compiling again would cost more than :data:`PAYS` of the planned steps
  (``pays`` False); else lets the steps run unsynced for ``seconds``, then
  syncs once, measures their time a step (``step_s``) and ends it."""

  order, every, name = -19, None, 'calibration'

  def __init__(self, budget: budget_lib.TimeBudget, seconds: float):
    self.budget, self.seconds = budget, seconds
    self.compiled_from = budget.compiled()
    self.mark: tuple[float, int] | None = None
    self.step_s: float | None = None
    self.pays: bool | None = None

  def __call__(self, info) -> Output | None:
    if info.end is not None or self.budget.planned is None:
      return None
    now = self.budget.clock()
    if self.mark is None:             # the first plan has just synced (and timed the evaluation)
      budget = self.budget
      again = (budget.compiled() - self.compiled_from) / budget.step_s   # steps lost
      self.pays = again <= PAYS * max(budget.planned - info.step, 1)
      if not self.pays:
        return Output(stop=End('early_stopped', info.step, 'not planned'))
      self.mark = (now, info.step)
      return None
    if now - self.mark[0] < self.seconds:
      return None
    jax.block_until_ready(info.state)
    self.step_s = (self.budget.clock() - self.mark[0]) / (info.step - self.mark[1])
    return Output(stop=End('early_stopped', info.step, 'calibrated'))


def calibrated(job, *, rebuild_s: float = 0.0) -> tuple[TrainConfig, dict]:
  """``job``'s config with ``--decay-steps`` set to the steps its time budget
  holds (when fewer than ``--steps``), and what was measured.

  Args:
    job: the run's :class:`purax.app.job.Job` (fresh, with ``--time-budget``
      and without ``--decay-steps``); its step is compiled and run a few
      times on a copy of its fresh state, which is then dropped.
    rebuild_s: seconds the run needs before its first step beyond the
      compilation (building the job again), kept out of the plan.

  Returns:
    ``(config, record)``; ``record``: ``{'planned_steps', 'decay_steps',
    'compile_s', 'step_s', 'eval_s', 'calibration_steps', 'calibration_s'}``
    (seconds; ``compile_s`` all the calibration compiled, counted again for
    the run; ``decay_steps`` None when the plan is not below ``--steps``),
    and ``'not_planned'`` (why, in words; ``planned_steps`` None) when
    compiling again would not pay (:data:`PAYS`): ``config`` unchanged, whose
    programs the calibration has compiled for the run.

  Raises:
    ConfigError: naming ``time_budget``, when the budget cannot hold the
      start-up, the compilation, one step and the final evaluation.
    jax.errors.JaxRuntimeError: the step ran out of memory (``purax train``
      fits it again, :func:`purax.app.runs.refit`, and plans anew).
  """
  config = job.config
  own = next(h for h in job.hooks if isinstance(h, budget_lib.TimeBudget))
  probe = budget_lib.TimeBudget(own.seconds, started=own.started, eval_data=own.eval_data,
                                tail_s=own.tail_s, probe_steps=own.probe_steps,
                                clock=own.clock, compiled=own.compiled)
  began = probe.clock()
  record = {'planned_steps': None, 'decay_steps': None}
  window = _Window(probe, min(max(MIN_WINDOW_S, WINDOW * probe.seconds), MAX_WINDOW_S))
  state, _ = fit(job.task, job.init(config.run.seed), job.train_data, steps=config.run.steps,
                 plan=job.plan, hooks=[probe, window], steps_per_call=config.run.steps_per_call)
  now = probe.clock()
  # The run compiles again what the calibration compiled (the step, the evaluation, ...).
  recompile_s = probe.compiled() - window.compiled_from
  step_s = window.step_s or probe.step_s    # the unsynced window's, else the probe's
  if step_s is not None and probe.eval_s and config.run.eval_every:
    step_s += probe.eval_s / config.run.eval_every   # the periodic evaluation, a step's share
  record.update(compile_s=recompile_s, step_s=step_s, eval_s=probe.eval_s,
                calibration_steps=int(state.step), calibration_s=round(now - began, 3))
  if step_s is None:             # ended before a plan (e.g. --steps within the probe)
    return config, record
  if window.pays is False:
    record['not_planned'] = (f'compiling again ({recompile_s:.1f} s) would cost more than '
                             f'{PAYS:.0%} of the {probe.planned} steps the budget holds')
    return config, record
  planned = budget_lib.plan_steps(0, now + recompile_s + rebuild_s, probe.deadline,
                                  step_s, probe.reserve_s)
  record['planned_steps'] = planned
  if planned >= config.run.steps:
    return config, record
  if planned < 1:     # the run's own budget check names it at its first call
    record['not_planned'] = 'no step fits in what is left of the budget'
    return config, record
  record['decay_steps'] = max(planned, 1)
  run = dataclasses.replace(config.run, decay_steps=record['decay_steps'])
  return dataclasses.replace(config, run=run), record
