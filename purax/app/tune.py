"""``purax tune lr``: the learning-rate range test of a ``purax train`` job.

The job is the one ``purax train`` would run for ``--steps`` (its model,
data, optimizer, warmup and decay over those steps: the suggestion is a
``--learning-rate`` for such a run), built by :func:`purax.app.job.build`;
:func:`purax.tune.lr_range_test` trains every rate of the log-spaced grid at
once, in one compiled program, from the one initial state of ``--seed``.
The run directory gets ``lr_range.png`` (:func:`purax.app.plot.plot_lr_range`)
and ``lr_range.json`` (the grid, every member's losses, the curve, the
suggestion and its rule). The options are :class:`RangeConfig`
(:mod:`purax.app.tune_config`).

With ``--time-budget`` the loop is planned by :class:`Budgeted` with the
arithmetic of :class:`purax.hooks.TimeBudget` (its clock started with the
process): the first step's compilation is measured and left out of the step
time (stated in the verdict's ``compile_s``), a budget that cannot hold it,
the :data:`purax.tune.lr_rules.MIN_STEPS` steps a range test needs and the end
is a :class:`purax.tune.RangeTestError` naming ``time_budget`` (the new
directory removed); the steps of every rate are planned after 3 timed steps,
at most ``--steps``, and re-planned at every tenth of the plan; the
suggestion, ``lr_range.png``, ``lr_range.json`` and ``verdict.json``
(:func:`purax.app.verdict.of_range`) are written inside the budget
(:data:`REPORT_S` kept for them besides the tail). The schedule's warmup and
decay still span ``--steps``.
"""

from __future__ import annotations

import json
import signal
import os
import shutil
import sys
import time

import jax
import numpy as np

from purax import hooks as hooks_lib
from purax import tune
from purax.app import job as job_lib
from purax.app import verdict as verdict_lib
from purax.app import jobdir as jobdir_lib
from purax.app import plot
from purax.app import sweep
from purax.app.tune_config import RangeConfig as RangeConfig
from purax.app.tune_config import RangeRunConfig as RangeRunConfig
from purax.hooks import time_budget as budget_lib
from purax.io import compile_time, progress, signals
from purax.io.checkpoint import Checkpointer
from purax.io.safe_files import open_file, write_atomic
from purax.io.signals import StopOnSignal
from purax.tune.lr_range import RangeTest, RangeTestError
from purax.tune.lr_rules import MIN_STEPS


def run(config: RangeConfig) -> dict:
  """Runs the range test of ``config``, or resumes it; returns ``{'suggestion',
  'rule', 'plot', ...}`` (what ``lr_range.json`` holds).

  The directory is locked and gets ``tune_config.json`` (a resumed test must
  have the same config); ``checkpoints/`` holds the population and its
  losses so far, saved every ``--checkpoint-every`` steps and when a
  SIGTERM/SIGINT stops it (it then returns ``{'stopped_by': SIGNAL, 'step':
  s}``); the same command resumes it, with the same losses bitwise (CPU).
  At the end ``lr_range.png`` then ``lr_range.json`` are written and the
  checkpoints removed; the same command on a finished test returns its
  ``lr_range.json``. A signal during start-up (up to the first step's
  compilation) stops with nothing written.

  Raises:
    ConfigError, DataError: bad options or data, before anything is written;
      ConfigError also when the directory's test has another config.
    RangeTestError: the test measured nothing usable (a ConfigError:
      fewer than 8 steps, before anything is written; at the end, fewer than
      two rates that trained without diverging, or a flat curve), saying
      what to change.
    FileExistsError: the directory holds something else.
  """
  config = config.validate().resolved()
  with StopOnSignal() as stop, jobdir_lib.JobDir(config.run.workdir, 'tune', config.flat(),
                                                 what='range test') as jobdir:
    workdir = jobdir.path
    if jobdir.resuming and os.path.isfile(jobdir.file('lr_range.json')):
      print(f'purax: range test {workdir} is finished; nothing to train', file=sys.stderr)
      with open_file(jobdir.file('lr_range.json'), encoding='utf-8') as f:
        return json.load(f)
    starting = sweep.start_phases(stop)
    starting('checking the directory')
    job = job_lib.build(config.train_config(), mesh=False, phase=starting)
    job_lib.check_population_memory(job, config.run.num_lrs, 'num_lrs')   # before any state
    state = job.init(config.run.seed)
    lrs = tune.log_grid(config.run.min_lr, config.run.max_lr, config.run.num_lrs)
    test = RangeTest(job.task, state, lrs=lrs, steps=config.run.steps,
                          rule=config.run.rule, strategy=config.run.strategy)
    budget = None if config.run.time_budget is None else job_lib.time_budget(
        config.run.time_budget, None, report_s=REPORT_S)
    if budget is not None:
      budget.expect_started(budget.clock())     # before the directory is made
    starting('initialising the population')
    jobdir.create()
    every = config.run.checkpoint_every
    with Checkpointer(jobdir.file('checkpoints'), keep_last=2, interval_s=None) as ckpt:
      if ckpt.steps():
        tree, _, step = ckpt.restore(test.abstract_tree(job.train_data[0]))
        test.restore(tree, step)
        print(f'purax: resuming range test {workdir} from step {step}', file=sys.stderr)
      first = test.done
      planner = Budgeted(budget, test) if budget is not None else None
      print(f'purax: range test of {len(lrs)} learning rates, {test.steps} steps each'
            f'{" at most (planned to --time-budget)" if budget is not None else ""}: '
            'compiling the population\'s step', file=sys.stderr, flush=True)
      shown = Shown(test, config.run.progress)
      try:
        while test.done < test.end:
          test.step(job.train_data[test.done])
          if planner is not None:
            planner.step()
          shown.step()
          if test.done == first + 1 and stop():     # the first call's compilation: start-up
            raise signals.Stopped(stop.received, 'during start-up (compiling the first step)')
          if stop() or (every and test.done % every == 0):
            ckpt.save(test.done, test.tree())
            ckpt.wait()
            jobdir.committed()
          if stop():
            print(f'purax: stopped by {stop.received} at step {test.done}; checkpoint '
                  f'committed in {jobdir.file("checkpoints")}; run the same command to resume '
                  f'(exit status {signals.status(signal.Signals[stop.received])})',
                  file=sys.stderr)
            if budget is not None:
              verdict_lib.write(jobdir.file(verdict_lib.VERDICT), verdict_lib.of_range(
                  config, hooks_lib.End('stopped', test.done, f'stopped by {stop.received}',
                                        signal=stop.received),
                  None, budget, compile_s=compile_time.seconds()))
            return {'stopped_by': stop.received, 'step': test.done}
      finally:
        shown.close()
        if ckpt.steps():
          jobdir.committed()
    result = test.result()
    title = (f'{config.model.name} on {config.data.name}: {len(lrs)} learning rates, '
             f'{test.end} steps each; suggested {result.suggestion:.3g}')
    path = plot.plot_lr_range(result, jobdir.file('lr_range.png'), title)
    summary = {'suggestion': result.suggestion, 'rule': result.rule, 'plot': path,
               'flags': f'--learning-rate {result.suggestion:.3g}',
               'config': config.train_config().flat(), **result.as_dict()}
    summary['config'].pop('workdir', None)
    # Last: a directory with lr_range.json is finished; the checkpoints are not needed then.
    if budget is not None:
      end = planner.end()
      summary['end'] = end.as_dict()
      verdict_lib.write(jobdir.file(verdict_lib.VERDICT), verdict_lib.of_range(
          config, end, result, budget, compile_s=compile_time.seconds()))
    write_atomic(jobdir.file('lr_range.json'), json.dumps(summary, indent=1))
    shutil.rmtree(jobdir.file('checkpoints'), ignore_errors=True)
  print(f'purax: learning-rate range test in {workdir}: suggested --learning-rate '
        f'{result.suggestion:.3g} ({result.rule}); {path}', file=sys.stderr)
  # After the last step: the test was finished, and is written.
  return jobdir_lib.finished(summary, stop, 'range test finished; its result')


#: Seconds a ``--time-budget`` keeps, besides its tail (the process's exit),
#: for the end of a range test: the suggestion, lr_range.png (a plot on the
#: CPU), lr_range.json and verdict.json.
REPORT_S = 3.0


class Budgeted:
  """The loop of a range test on a ``--time-budget``: ``step()`` after each
  of ``test``'s steps, with ``budget``'s clock and arithmetic
  (:class:`purax.hooks.TimeBudget`: :meth:`~purax.hooks.TimeBudget.start`,
  ``compiled_call``, ``probed``, ``first_plan``, ``replan``; the rule
  :func:`purax.hooks.time_budget.plan_steps`). It sets the test's end
  (:meth:`purax.tune.lr_range.RangeTest.end_at`) to the planned step, at most
  ``steps``; it syncs with the device after the first call, each probe step
  and each re-plan (every tenth of the plan), nowhere else.

  Raises (from ``step()``):
    RangeTestError: naming ``time_budget``, when after the first call the
      compilation, the steps left of :data:`MIN_STEPS` at that call's speed
      and the reserve do not fit; or when the first plan holds fewer than
      :data:`MIN_STEPS` steps. A later re-plan below it ends at
      :data:`MIN_STEPS` (the least a range test reads).
  """

  def __init__(self, budget: hooks_lib.TimeBudget, test: RangeTest):
    self.budget, self.test = budget, test
    budget.start(test.done)
    self._every = None    # steps between re-plans: a tenth of the first plan

  def step(self) -> None:
    budget, test = self.budget, self.test
    if budget.compile_s is None:              # the first call: it compiled
      jax.block_until_ready(test.pop)
      now, first_s = budget.compiled_call(test.done)
      budget.expect_room(now, max(MIN_STEPS - test.done, 1), first_s,
                         what=f'{max(MIN_STEPS - test.done, 1)} more steps (a range test '
                         f'reads at least {MIN_STEPS})',
                         kept='the suggestion, its plot and files', error=RangeTestError)
    elif budget.planned is None:              # probing
      jax.block_until_ready(test.pop)
      if budget.probed(test.done):
        planned = budget.first_plan(test.done)
        held = min(planned, test.steps)
        if held < MIN_STEPS:
          raise RangeTestError(
              f'time_budget: expected a budget that holds at least {MIN_STEPS} steps of '
              f'{budget.step_s * 1e3:.3g} ms (measured; compilation {budget.compile_s:.1f} s '
              f'left out) and {budget.reserve_s:.1f} s kept for the end, got '
              f'{budget.seconds:g} s, which holds {planned} steps')
        self._every = max(1, (held - test.done) // 10)
        self._end_at(planned)
    elif (test.done - self.budget.plans[0][0]) % self._every == 0:   # a re-plan
      jax.block_until_ready(test.pop)
      self._end_at(budget.replan(test.done))

  def _end_at(self, planned: int) -> None:
    test = self.test
    test.end_at(max(min(planned, test.steps), test.done, MIN_STEPS))

  def end(self) -> hooks_lib.End:
    """How the finished test ended: by the budget, or at ``--steps`` first."""
    budget, test = self.budget, self.test
    if test.end < test.steps:
      return hooks_lib.End('finished', test.done, f'{budget_lib.REASON} of '
                           f'{budget.seconds:g} s: {test.done} steps at '
                           f'{budget.step_s * 1e3:.3g} ms a step (compilation '
                           f'{budget.compile_s:.1f} s left out)')
    return hooks_lib.End('finished', test.done, f'reached step {test.done}')


class Shown:
  """What a range test shows while it trains: a tqdm bar on a terminal
  (:func:`purax.io.progress.bar`: after every step, which then waits for
  that step), and otherwise a line at every tenth of the steps
  (:func:`purax.io.progress.log_line`), each with the least loss of the
  last step and the rate that has it."""

  def __init__(self, test: RangeTest, enabled: bool):
    self.test, self.start = test, time.perf_counter()
    self.bar = progress.bar(total=test.steps, initial=test.done, enabled=enabled,
                            desc='range test')

  def _least(self) -> str:
    last = self.test.losses()[-1]     # waits for the steps dispatched
    finite = np.isfinite(last)
    if not finite.any():
      return 'every loss non-finite'
    i = int(np.nanargmin(np.where(finite, last, np.nan)))
    return (f'least loss {last[i]:.4g} at learning rate {self.test.lrs[i]:.3g}; '
            f'{int((~finite).sum())} of {len(last)} non-finite')

  def step(self) -> None:
    done = self.test.done
    if not isinstance(self.bar, progress.NullBar):
      if self.bar.total != self.test.end:     # a time budget planned the steps
        self.bar.total = self.test.end
      self.bar.set_postfix_str(self._least(), refresh=False)
      self.bar.update(1)
    elif done % max(1, self.test.end // 10) == 0 or done == self.test.end:
      progress.log_line(f'[range test {done}/{self.test.end}] {self._least()} '
                        f'({time.perf_counter() - self.start:.1f} s)')

  def close(self) -> None:
    self.bar.close()
