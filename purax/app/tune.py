"""``purax tune lr``: the learning-rate range test of a ``purax train`` job.

The job is the one ``purax train`` would run for ``--steps`` (its model,
data, optimizer, warmup and decay over those steps: the suggestion is a
``--learning-rate`` for such a run), built by :func:`purax.app.job.build`;
:func:`purax.tune.lr_range_test` trains every rate of the log-spaced grid at
once, in one compiled program, from the one initial state of ``--seed``.
The run directory gets ``lr_range.png`` (:func:`purax.app.plot.plot_lr_range`)
and ``lr_range.json`` (the grid, every member's losses, the curve, the
suggestion and its rule).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Literal

from purax import tune
from purax.app import job as job_lib
from purax.app import plot
from purax.app.config import RunConfig, Sections, TrainConfig
from purax.app.data import DataConfig
from purax.app.hparams import OptimizerConfig
from purax.app.models import ModelConfig
from purax.core import population as pop_lib
from purax.core.errors import ConfigError, expect
from purax.io.safe_files import write_atomic


@dataclasses.dataclass(frozen=True)
class RangeRunConfig:
  """The range test.

  Attributes:
    steps: updates per learning rate (the budget; warmup and decay span it as in
      purax train --steps).
    seed: seed of initialization, shuffling and dropout (one initial state for all).
    min_lr: the smallest learning rate of the grid.
    max_lr: the largest learning rate of the grid.
    num_lrs: learning rates in the grid, log-spaced (members of the population).
    rule: how the rate is suggested: steepest (the steepest descent of the
      smoothed loss, Lightning's lr_find) or minimum (a tenth of the rate of
      least loss, fastai's lr_find).
    workdir: where lr_range.png and lr_range.json go; runs/lr-DATASET-MODEL-TIME
      when unset; must not exist.
    strategy: how the members share the machine: auto, vmap (all at once), chunked
      or sequential (purax.core.population.chunk_size); the values are the same.
  """

  steps: int = 100
  seed: int = 0
  min_lr: float = 1e-5
  max_lr: float = 1.0
  num_lrs: int = 16
  rule: Literal[tune.RULES] = 'steepest'
  workdir: str | None = None
  strategy: Literal[pop_lib.STRATEGIES] = 'auto'


@dataclasses.dataclass(frozen=True)
class RangeConfig(Sections):
  """``purax tune lr``: the sections of ``purax train`` (its --learning-rate is
  replaced by the grid) and the range test's own options."""

  model: ModelConfig = ModelConfig()
  data: DataConfig = DataConfig()
  optimizer: OptimizerConfig = OptimizerConfig()
  run: RangeRunConfig = RangeRunConfig()

  def validate(self) -> 'RangeConfig':
    """Raises ConfigError naming the field, the expected and the actual value."""
    self.train_config().validate()
    run = self.run
    tune.log_grid(run.min_lr, run.max_lr, run.num_lrs)
    expect(run.max_lr <= 10, 'max_lr', '<= 10 (the bound of a learning rate)', run.max_lr,
           ConfigError)
    return self

  def train_config(self) -> TrainConfig:
    """The ``purax train`` job whose rate is tested."""
    return TrainConfig(model=self.model.with_sizes(), data=self.data, optimizer=self.optimizer,
                       run=RunConfig(steps=self.run.steps, seed=self.run.seed,
                                     workdir=self.run.workdir or 'unused', progress=False))

  def resolved(self) -> 'RangeConfig':
    if self.run.workdir:
      return self
    name = self.data.name.replace(':', '_').replace('/', '_')
    workdir = os.path.join('runs', f"lr-{name}-{self.model.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    return dataclasses.replace(self, run=dataclasses.replace(self.run, workdir=workdir))


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
