"""The options of ``purax sweep`` (:class:`SweepConfig`): the sections of
``purax train`` with each hyperparameter of :data:`purax.app.hparam_table.HPARAMS`
a search spec, plus the population's own. What a sweep runs is
:mod:`purax.app.sweep`; this module imports no jax (``purax sweep --help``).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, Mapping

import tyro

from purax.app import hparam_table as hparams_lib
from purax.app.config import RunConfig, Sections, TrainConfig
from purax.app.data import DataConfig
from purax.app.hparam_table import OptimizerConfig, OptimizerSearch
from purax.app.models import ModelConfig
from purax.core import lazy
from purax.core.errors import ConfigError, expect

# The ranking rule and the population's bound, used by the methods: imported on use.
metrics_lib, pop_lib, search, config_lib = lazy.modules(
    'purax.core.metrics', 'purax.core.population', 'purax.app.search', 'purax.app.config')


@dataclasses.dataclass(frozen=True)
class PopulationConfig:
  """The population of a sweep.

  Attributes:
    seeds: comma-separated seeds; crossed with every list spec.
    members: population size when a spec is random; when unset the grid size
      (at most 2**16, and the members' states must fit in memory).
    sample_seed: seed of the random draws.
    metric: eval metric that ranks members (loss is minimised, accuracy maximised).
    patience: early-stop a member after N evaluations without improvement (0: off).
    pbt_every: population-based training every N steps, after that step's
      evaluation (a multiple of --eval-every; 0: off).
    pbt_fraction: share of members replaced by PBT, in (0, 0.5].
    baseline: with --time-budget, the member whose configuration the others are
      tested against in verdict.json (over their seeds: Welch's t-test).
    parent: RUN or RUN:STEP (--from): every member starts from this purax train
      run's checkpoint (its newest, or STEP) and continues it with its own
      hyperparameters; options left out take the parent's (purax.app.fork).
  """

  seeds: str = '0'
  members: int | None = None
  sample_seed: int = 0
  metric: Literal['loss', 'accuracy'] = 'loss'
  patience: int = 0
  pbt_every: int = 0
  pbt_fraction: float = 0.25
  baseline: int = 0
  parent: Annotated[str | None, tyro.conf.arg(name='from')] = None

  def best(self) -> metrics_lib.Best:
    """The ranking rule of ``--metric``: eval loss minimised, accuracy maximised
    (:class:`purax.core.metrics.Best`, as ``purax train --best-metric``)."""
    return metrics_lib.Best(f'eval/{self.metric}', 'min' if self.metric == 'loss' else 'max')

  def validate(self, eval_every: int) -> 'PopulationConfig':
    for name in ('patience', 'pbt_every', 'sample_seed'):
      expect(getattr(self, name) >= 0, name, '>= 0', getattr(self, name), ConfigError)
    expect(0 < self.pbt_fraction <= 0.5, 'pbt_fraction', 'in (0, 0.5]', self.pbt_fraction,
           ConfigError)
    expect(not self.pbt_every or (eval_every and self.pbt_every % eval_every == 0),
           'pbt_every', f'0 or a multiple of eval_every={eval_every} (PBT ranks members '
           'by the evaluation at its step' + (': set --eval-every' if not eval_every else '')
           + ')', self.pbt_every, ConfigError)
    return self


@dataclasses.dataclass(frozen=True)
class SweepRunConfig:
  """The run of a sweep (each member's seed comes from --seeds).

  Attributes:
    steps: optimizer updates per member.
    workdir: sweep directory, runs/sweep-DATASET-MODEL-TIME when unset; new, empty, or a
      stopped sweep of the same options to resume.
    log_every: fetch training metrics every N steps.
    eval_every: evaluate every N steps (0: at the end only).
    progress: show a progress bar.
    mesh: every member on a device mesh, e.g. 'data=2' (each batch split over it).
    time_budget: end the sweep within this wall time, e.g. '60s', '5m', '1h', as
      purax train --time-budget; verdict.json then reports each member and, per
      configuration, the mean and spread over its seeds and Welch's t-test against
      --baseline.
  """

  steps: int = 300
  workdir: str | None = None
  log_every: int = 25
  eval_every: int = 100
  progress: bool = True
  mesh: str | None = None
  time_budget: str | None = None

  def validate(self) -> 'SweepRunConfig':
    self.as_run().validate()
    return self

  def as_run(self, **changes) -> RunConfig:
    """The :class:`RunConfig` of a member (its checkpoint: at the end only)."""
    return dataclasses.replace(RunConfig(steps=self.steps, workdir=self.workdir,
                                         log_every=self.log_every, eval_every=self.eval_every,
                                         progress=self.progress, mesh=self.mesh,
                                         checkpoint_interval_s=0.0,
                                         time_budget=self.time_budget), **changes)


@dataclasses.dataclass(frozen=True)
class SweepConfig(Sections):
  """A sweep: many training runs of one model, trained at once as a population
  (``purax sweep``): the sections of ``purax train``, each optimizer
  hyperparameter a search spec."""

  model: ModelConfig = ModelConfig(name='mlp')
  data: DataConfig = DataConfig()
  optimizer: OptimizerSearch = OptimizerSearch(warmup_steps=20)
  run: SweepRunConfig = SweepRunConfig()
  population: PopulationConfig = PopulationConfig()

  def validate(self) -> 'SweepConfig':
    """Checks every section and spec.

    Raises:
      ConfigError: naming the field, the expected and the actual value.
    """
    self.optimizer.validate()
    config_lib.refuse_rollback(self.optimizer)
    declared, defaults = self.data.loss_hparams(), OptimizerSearch()
    for row in hparams_lib.HPARAMS:    # a loss row the loss does not declare is not searched
      value = getattr(self.optimizer, row.field)
      expect(row.where != 'loss' or row.state in declared or value == getattr(defaults, row.field),
             row.field, f'unset for --loss {self.data.loss} (it declares '
             f'{sorted(declared) or "no hyperparameter"}: purax.loss_function(hparams=...))',
             repr(value), ConfigError)
    start = hparams_lib.BY_STATE['decay_start']
    cooldowns = self.specs().get('cooldown_steps', ())
    expect(self.optimizer.decay_start != repr(start.default)
           or (isinstance(cooldowns, tuple) and len(cooldowns) <= 1), 'decay_start',
           'given when --cooldown-steps varies (sweep --from: the branch step)', 'unset',
           ConfigError)
    self.base().validate()
    self.run.validate()       # and its --time-budget
    self.population.validate(self.run.eval_every)
    specs = self.specs()
    random = ['--' + row.field.replace('_', '-') for row in hparams_lib.HPARAMS
              if row.state in specs and not isinstance(specs[row.state], tuple)]
    expect(not random or self.population.members is not None, 'members',
           f'a population size (--members N) when a spec is random ({", ".join(random)})',
           'unset', ConfigError)
    size, how = self.population_size()
    expect(1 <= size <= pop_lib.MAX_MEMBERS, 'members',
           f'a population of 1 to 2**16 = {pop_lib.MAX_MEMBERS} members', f'{size} ({how})',
           ConfigError)
    config_lib.check_spike_window(self.optimizer, members=size)
    expect(0 <= self.population.baseline < size, 'baseline',
           f'a member of the population, in [0, {size})', self.population.baseline,
           ConfigError)
    return self

  def population_size(self) -> tuple[int, str]:
    """``(members, how)``: ``--members``, or the grid's size (each list spec's
    length times the seeds), counted without building it."""
    if self.population.members is not None:
      return self.population.members, '--members'
    lengths = [len(s) for s in self.specs().values() if isinstance(s, tuple)]
    seeds = len(search.parse_seeds(self.population.seeds))
    size = seeds
    for n in lengths:
      size *= n
    return size, ('the grid: ' + ' x '.join(map(str, [n for n in lengths if n > 1] + [seeds]))
                  + ' seeds')

  def specs(self) -> dict[str, Any]:
    """``state name -> spec`` of every hyperparameter the optimizer and the loss
    take (a tuple or a distribution): a loss row only when the loss declares it."""
    declared = self.data.loss_hparams()
    specs = {row.state: hparams_lib.parse_spec(row, getattr(self.optimizer, row.field))
             for row in hparams_lib.HPARAMS
             if hparams_lib.takes(self.optimizer.name, row, self.optimizer.schedule)
             and (row.where != 'loss' or row.state in declared)}
    # An unset schedule row (--schedule wsd): its value derived from --steps and the first
    # cooldown (validate refuses an unset --decay-start with several cooldowns).
    unset = {row.state for row in hparams_lib.HPARAMS if row.unset and row.state in specs
             and specs[row.state] == (row.default,)}
    if unset:
      first = {n: s[0] if isinstance(s, tuple) else s.low for n, s in specs.items()}
      derived = hparams_lib.schedule_values(first, self.run.steps)
      specs.update({n: (derived[n],) for n in unset})
    return specs

  def base(self, values: Mapping[str, float] | None = None, *, seed: int | None = None,
           workdir: str | None = None) -> TrainConfig:
    """The :class:`TrainConfig` of one member: hyperparameters ``values``
    (state names; default the first value of each spec), its seed and run directory."""
    first = {n: s[0] if isinstance(s, tuple) else s.low for n, s in self.specs().items()}
    values = {**first, **(values or {})}
    settings = {name: getattr(self.optimizer, name) for name in hparams_lib.SETTINGS}
    optimizer = OptimizerConfig(**settings, **{row.field: float(values[row.state])
                                               for row in hparams_lib.HPARAMS
                                               if row.state in values})
    run = self.run.as_run(progress=False, seed=0 if seed is None else int(seed),
                          workdir=workdir if workdir is not None else self.run.workdir,
                          time_budget=None)   # the sweep's, not a member run's
    return TrainConfig(model=self.model.with_sizes(), data=self.data, optimizer=optimizer,
                       run=run)

  def resolved(self) -> 'SweepConfig':
    if self.run.workdir:
      return self
    return dataclasses.replace(self, run=dataclasses.replace(
        self.run, workdir=config_lib.default_workdir('sweep', self.data.name, self.model.name)))
