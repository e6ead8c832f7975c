"""The options of ``purax tune lr`` (:class:`RangeConfig`): the sections of
``purax train`` and the range test's own. What it runs is :mod:`purax.app.tune`;
this module imports no jax (``purax tune lr --help``).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from purax.app.config import RunConfig, Sections, TrainConfig
from purax.app.data import DataConfig
from purax.app.hparam_table import OptimizerConfig
from purax.app.models import ModelConfig
from purax.core import lazy
from purax.core.errors import ConfigError, expect
from purax.core.strategies import STRATEGIES
from purax.tune.lr_rules import DEFAULT_RULE, MIN_STEPS, RULES

# The grid's check and the population's bound, used by validate(): imported on use.
lr_range, pop_lib, config_lib, budget_hook = lazy.modules(
    'purax.tune.lr_range', 'purax.core.population', 'purax.app.config',
    'purax.hooks.time_budget')


@dataclasses.dataclass(frozen=True)
class RangeRunConfig:
  """The range test.

  Attributes:
    steps: updates per learning rate (the budget; warmup and decay span it as in
      purax train --steps); at least 8.
    seed: seed of initialization, shuffling and dropout (one initial state for all).
    min_lr: the smallest learning rate of the grid.
    max_lr: the largest learning rate of the grid.
    num_lrs: learning rates in the grid, log-spaced (members of the population;
      2 to 2**16, and their states must fit in memory).
    rule: how the rate is suggested (purax.tune.lr_range): lowest (the rate of
      least loss over the last quarter of the steps: each rate is its own run),
      largest_within (the largest rate within 10% of that loss), steepest (the
      steepest descent of the curve, Lightning's lr_find, made for a single run
      whose rate grows) or minimum (a tenth of the rate of least loss, fastai's).
    workdir: where lr_range.png and lr_range.json go; runs/lr-DATASET-MODEL-TIME
      when unset; new, empty, or a stopped range test of the same options to resume.
    strategy: how the members share the machine: auto, vmap (all at once), chunked
      or sequential (purax.core.population.chunk_size); the values are the same.
    checkpoint_every: save the population every N steps (0: only when a
      SIGTERM/SIGINT stops the test); the same command resumes it.
    progress: show a progress bar on a terminal; otherwise (or with --no-progress)
      a line with the least loss so far at every tenth of the steps.
    time_budget: end the test within this wall time of the command, e.g. '60s', '5m':
      the steps of every rate are planned from the measured step time (compilation
      left out), at most --steps and at least 8 (a budget that cannot hold the
      compilation and 8 steps is an error before a directory is kept), the suggestion,
      lr_range.png and lr_range.json are written inside it, and so is verdict.json.
      Warmup and decay still span --steps (the schedule is not shortened to the plan).
  """

  steps: int = 100
  seed: int = 0
  min_lr: float = 1e-5
  max_lr: float = 1.0
  num_lrs: int = 16
  rule: Literal[RULES] = DEFAULT_RULE
  workdir: str | None = None
  strategy: Literal[STRATEGIES] = 'auto'
  checkpoint_every: int = 0
  progress: bool = True
  time_budget: str | None = None


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
    config_lib.refuse_rollback(self.optimizer)
    self.train_config().validate()
    run = self.run
    expect(2 <= run.num_lrs <= pop_lib.MAX_MEMBERS, 'num_lrs',
           f'2 to 2**16 = {pop_lib.MAX_MEMBERS} learning rates (each a member of the '
           'population, with a whole training state)', run.num_lrs, ConfigError)
    config_lib.check_spike_window(self.optimizer, members=run.num_lrs)
    lr_range.log_grid(run.min_lr, run.max_lr, run.num_lrs)
    expect(run.steps >= MIN_STEPS, 'steps', f'at least {MIN_STEPS} steps for a range test to '
           'tell the rates apart (raise --steps)', run.steps, lr_range.RangeTestError)
    expect(run.checkpoint_every >= 0, 'checkpoint_every', '>= 0 (0: only at a stop)',
           run.checkpoint_every, ConfigError)
    if run.time_budget is not None:
      budget_hook.parse_duration(run.time_budget, 'time_budget')
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
    return dataclasses.replace(self, run=dataclasses.replace(
        self.run, workdir=config_lib.default_workdir('lr', self.data.name, self.model.name)))
