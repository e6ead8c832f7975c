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

from purax import tune
from purax.app import job as job_lib
from purax.app import jobdir as jobdir_lib
from purax.app import plot
from purax.app import sweep
from purax.app.tune_config import RangeConfig as RangeConfig
from purax.app.tune_config import RangeRunConfig as RangeRunConfig
from purax.io import signals
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
      ConfigError also when fewer than two rates trained without diverging
      (lower --max-lr), or when the directory's test has another config.
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
      try:
        while test.done < test.steps:
          test.step(job.train_data[test.done])
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
