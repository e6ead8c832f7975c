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
"""

from __future__ import annotations

import json
import signal
import os
import shutil
import sys
import time

import numpy as np

from purax import tune
from purax.app import job as job_lib
from purax.app import jobdir as jobdir_lib
from purax.app import plot
from purax.app import sweep
from purax.app.tune_config import RangeConfig as RangeConfig
from purax.app.tune_config import RangeRunConfig as RangeRunConfig
from purax.io import progress, signals
from purax.io.checkpoint import Checkpointer
from purax.io.safe_files import open_file, write_atomic
from purax.io.signals import StopOnSignal
from purax.tune.lr_range import RangeTest


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
    starting('initialising the population')
    jobdir.create()
    every = config.run.checkpoint_every
    with Checkpointer(jobdir.file('checkpoints'), keep_last=2, interval_s=None) as ckpt:
      if ckpt.steps():
        tree, _, step = ckpt.restore(test.abstract_tree(job.train_data[0]))
        test.restore(tree, step)
        print(f'purax: resuming range test {workdir} from step {step}', file=sys.stderr)
      first = test.done
      print(f'purax: range test of {len(lrs)} learning rates, {test.steps} steps each: '
            'compiling the population\'s step', file=sys.stderr, flush=True)
      shown = Shown(test, config.run.progress)
      try:
        while test.done < test.steps:
          test.step(job.train_data[test.done])
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
            return {'stopped_by': stop.received, 'step': test.done}
      finally:
        shown.close()
        if ckpt.steps():
          jobdir.committed()
    result = test.result()
    title = (f'{config.model.name} on {config.data.name}: {len(lrs)} learning rates, '
             f'{config.run.steps} steps each; suggested {result.suggestion:.3g}')
    path = plot.plot_lr_range(result, jobdir.file('lr_range.png'), title)
    summary = {'suggestion': result.suggestion, 'rule': result.rule, 'plot': path,
               'flags': f'--learning-rate {result.suggestion:.3g}',
               'config': config.train_config().flat(), **result.as_dict()}
    summary['config'].pop('workdir', None)
    # Last: a directory with lr_range.json is finished; the checkpoints are not needed then.
    write_atomic(jobdir.file('lr_range.json'), json.dumps(summary, indent=1))
    shutil.rmtree(jobdir.file('checkpoints'), ignore_errors=True)
  print(f'purax: learning-rate range test in {workdir}: suggested --learning-rate '
        f'{result.suggestion:.3g} ({result.rule}); {path}', file=sys.stderr)
  if stop():     # after the last step: the test was finished, and is written
    print(f'purax: {stop.received} arrived as the range test finished; its result is written '
          f'(exit status {signals.status(signal.Signals[stop.received])})', file=sys.stderr)
    return {**summary, 'stopped_by': stop.received}   # still answered by its status
  return summary


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
    self.every = max(1, test.steps // 10)

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
      self.bar.set_postfix_str(self._least(), refresh=False)
      self.bar.update(1)
    elif done % self.every == 0 or done == self.test.steps:
      progress.log_line(f'[range test {done}/{self.test.steps}] {self._least()} '
                        f'({time.perf_counter() - self.start:.1f} s)')

  def close(self) -> None:
    self.bar.close()
