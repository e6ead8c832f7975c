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
import os
import sys

from purax import tune
from purax.app import job as job_lib
from purax.app import plot
from purax.app.tune_config import RangeConfig as RangeConfig
from purax.app.tune_config import RangeRunConfig as RangeRunConfig
from purax.core.errors import expect
from purax.io.safe_files import write_atomic


def run(config: RangeConfig) -> dict:
  """Runs the range test of ``config``; returns ``{'suggestion', 'rule', 'plot', ...}``.

  Raises:
    ConfigError, DataError: bad options or data, before anything is written;
      ConfigError also when fewer than two rates trained without diverging
      (nothing written: lower --max-lr).
    FileExistsError: the directory exists.
  """
  config = config.validate().resolved()
  workdir = config.run.workdir
  expect(not os.path.exists(workdir), 'workdir', 'a directory that does not exist yet',
         repr(workdir), FileExistsError)
  job = job_lib.build(config.train_config(), mesh=False)
  job_lib.check_population_memory(job, config.run.num_lrs, 'num_lrs')   # before any state
  state = job.init(config.run.seed)
  lrs = tune.log_grid(config.run.min_lr, config.run.max_lr, config.run.num_lrs)
  result = tune.lr_range_test(job.task, state, (job.train_data[s] for s in
                                                range(config.run.steps)),
                              lrs=lrs, steps=config.run.steps, rule=config.run.rule,
                              strategy=config.run.strategy)
  os.makedirs(workdir)
  title = (f'{config.model.name} on {config.data.name}: {len(lrs)} learning rates, '
           f'{config.run.steps} steps each; suggested {result.suggestion:.3g}')
  path = plot.plot_lr_range(result, os.path.join(workdir, 'lr_range.png'), title)
  summary = {'suggestion': result.suggestion, 'rule': result.rule, 'plot': path,
             'flags': f'--learning-rate {result.suggestion:.3g}',
             'config': config.train_config().flat(), **result.as_dict()}
  summary['config'].pop('workdir', None)
  write_atomic(os.path.join(workdir, 'lr_range.json'), json.dumps(summary, indent=1))
  print(f'purax: learning-rate range test in {workdir}: suggested --learning-rate '
        f'{result.suggestion:.3g} ({result.rule}); {path}', file=sys.stderr)
  return summary
