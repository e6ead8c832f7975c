"""``purax sweep``: many training runs of one task, trained at once as a population.

Every member of a grid or random search trains in one compiled program
(:mod:`purax.core.population`), whatever the values: the same job as
``purax train`` (any model and data set of the tables, ``--precision``,
``--mesh``), built once by :func:`purax.app.job.build`, with each optimizer
or loss hyperparameter of :data:`purax.app.hparams.HPARAMS` a search spec.
Each member ``i`` reads the batches of its own seed (members that share a
seed share batches), so member ``i`` computes what ``purax train`` computes
with member ``i``'s hyperparameters and seed. The loop is :func:`purax.fit`
(a :class:`purax.plan.PopulationPlan` and :func:`population_hooks`). At the end the report
(:mod:`purax.app.report`) ranks the members, writes ``sweep.json`` and
``curves.png`` and saves the best member as an ordinary run in ``WORKDIR/best``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Literal, Mapping
import shutil

import jax
import jax.numpy as jnp
import numpy as np

from purax import parallel
from purax import plan as plan_lib
from purax.app import job as job_lib
from purax.app import report
from purax.app.config import RunConfig, Sections, TrainConfig
from purax.app.data import DataConfig
from purax.app.models import ModelConfig
from purax.app import hparams as hparams_lib
from purax.app.hparams import OptimizerConfig, OptimizerSearch
from purax.app.hparams import BY_STATE
from purax.app.search import members_from_specs, parse_seeds
from purax.core import population as pop_lib
from purax.core.errors import ConfigError, expect
from purax.core.metrics import Best
from purax import hooks as hooks_lib
from purax.loop import fit


@dataclasses.dataclass(frozen=True)
class PopulationConfig:
  """The population of a sweep.

  Attributes:
    seeds: comma-separated seeds; crossed with every list spec.
    members: population size when a spec is random; when unset the grid size.
    sample_seed: seed of the random draws.
    metric: eval metric that ranks members (loss is minimised, accuracy maximised).
    patience: early-stop a member after N evaluations without improvement (0: off).
    pbt_every: population-based training every N steps, after that step's
      evaluation (a multiple of --eval-every; 0: off).
    pbt_fraction: share of members replaced by PBT, in (0, 0.5].
  """

  seeds: str = '0'
  members: int | None = None
  sample_seed: int = 0
  metric: Literal['loss', 'accuracy'] = 'loss'
  patience: int = 0
  pbt_every: int = 0
  pbt_fraction: float = 0.25

  def best(self) -> Best:
    """The ranking rule of ``--metric``: eval loss minimised, accuracy maximised
    (:class:`purax.core.metrics.Best`, as ``purax train --best-metric``)."""
    return Best(f'eval/{self.metric}', 'min' if self.metric == 'loss' else 'max')

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
    workdir: sweep directory, runs/sweep-DATASET-MODEL-TIME when unset; must not exist.
    log_every: fetch training metrics every N steps.
    eval_every: evaluate every N steps (0: at the end only).
    progress: show a progress bar.
    mesh: every member on a device mesh, e.g. 'data=2' (each batch split over it).
  """

  steps: int = 300
  workdir: str | None = None
  log_every: int = 25
  eval_every: int = 100
  progress: bool = True
  mesh: str | None = None

  def validate(self) -> 'SweepRunConfig':
    self.as_run().validate()
    return self

  def as_run(self, **changes) -> RunConfig:
    """The :class:`RunConfig` of a member (its checkpoint: at the end only)."""
    return dataclasses.replace(RunConfig(steps=self.steps, workdir=self.workdir,
                                         log_every=self.log_every, eval_every=self.eval_every,
                                         progress=self.progress, mesh=self.mesh,
                                         checkpoint_interval_s=0.0), **changes)


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
    self.base().validate()
    self.population.validate(self.run.eval_every)
    specs = self.specs()
    random = ['--' + row.field.replace('_', '-') for row in hparams_lib.HPARAMS
              if row.state in specs and not isinstance(specs[row.state], tuple)]
    expect(not random or self.population.members is not None, 'members',
           f'a population size (--members N) when a spec is random ({", ".join(random)})',
           'unset', ConfigError)
    return self

  def specs(self) -> dict[str, Any]:
    """``state name -> spec`` of every hyperparameter the optimizer and the loss
    take (a tuple or a distribution)."""
    return {row.state: hparams_lib.parse_spec(row, getattr(self.optimizer, row.field))
            for row in hparams_lib.HPARAMS if hparams_lib.takes(self.optimizer.name, row)}

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
                          workdir=workdir if workdir is not None else self.run.workdir)
    return TrainConfig(model=self.model.with_sizes(), data=self.data, optimizer=optimizer,
                       run=run)

  def resolved(self) -> 'SweepConfig':
    if self.run.workdir:
      return self
    name = self.data.name.replace(':', '_').replace('/', '_')
    workdir = os.path.join('runs', f"sweep-{name}-{self.model.name}-"
                           f"{time.strftime('%Y%m%d-%H%M%S')}")
    return dataclasses.replace(self, run=dataclasses.replace(self.run, workdir=workdir))


@jax.jit
def _keys(seeds):
  return jax.vmap(jax.random.key)(seeds)


class SeedBatches:
  """``ds[s]``: step ``s``'s batches of each distinct seed, stacked ``[seeds, batch, ...]``
  (the one seed's batch itself when there is one)."""

  def __init__(self, datasets):
    self._datasets = datasets

  def __len__(self):
    return len(self._datasets[0])

  def __getitem__(self, s):
    if len(self._datasets) == 1:
      return self._datasets[0][s]
    batches = [d[s] for d in self._datasets]
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def members(config: SweepConfig):
  """``(seeds int32 [members], hparams: state name -> float32 [members])`` of a
  validated sweep (grid over list specs and seeds, draws for distributions)."""
  return members_from_specs(config.specs(), parse_seeds(config.population.seeds),
                            config.population.members,
                            key=jax.random.key(config.population.sample_seed))


def population_hooks(config: SweepConfig, hparams: dict, eval_data) -> list:
  """The sweep's hooks: logging and evaluation, per-member early stopping
  (``--patience``) and PBT (``--pbt-every``), ranked by ``--metric``.

  Raises:
    ConfigError: ``pbt_every`` not a multiple of ``eval_every``.
  """
  population, run = config.population, config.run
  mode = population.best().mode
  hooks = hooks_lib.standard(log_every=run.log_every, eval_data=eval_data,
                             eval_every=run.eval_every, max_consecutive_skips=None,
                             progress=run.progress)
  if population.patience:
    hooks.append(hooks_lib.PopulationEarlyStopping(metric=population.metric, mode=mode,
                                                   patience=population.patience))
  if population.pbt_every:
    pbt = hooks_lib.PBT(every=population.pbt_every, metric=population.metric, mode=mode,
                        fraction=population.pbt_fraction,
                        key=jax.random.key(population.sample_seed),
                        names=report.swept(hparams) or ('peak_learning_rate',),
                        bounds={name: BY_STATE[name].clip_bounds() for name in hparams
                                if name in BY_STATE})
    pbt.check(run.eval_every)
    hooks.append(pbt)
  return hooks


def run(config: SweepConfig) -> dict:
  """Runs a sweep end to end; returns the summary written to ``sweep.json``.

  Writes ``WORKDIR/sweep.json`` (members sorted by the eval metric, their
  hyperparameters, status and curves), ``curves.png`` and ``best/`` (an
  ordinary run: ``config.json``, ``checkpoints/``, ``final_metrics.json``).

  Raises:
    ConfigError, DataError: before anything is written; FileExistsError: the
      sweep directory exists. A sweep that fails midway removes its directory.
  """
  config = config.validate().resolved()
  seeds, hparams = members(config)
  base = config.base(seed=int(seeds[0]))
  job = job_lib.build(base, mesh=False)
  steps, batch_size = config.run.steps, config.data.batch_size
  unique, batch_index = np.unique(seeds, return_inverse=True)
  train_data = SeedBatches([job.data.train(batch_size, int(u), steps) for u in unique])
  mesh = None
  if config.run.mesh is not None:
    mesh = parallel.make_mesh(**parallel.parse_mesh(config.run.mesh))
    expect(batch_size % mesh.devices.size == 0, 'batch_size',
           f'a multiple of the mesh size {mesh.devices.size} (each batch is split over it)',
           batch_size, ConfigError)
  workdir = config.run.workdir
  expect(not os.path.exists(workdir), 'workdir', 'a directory that does not exist yet',
         repr(workdir), FileExistsError)
  index = None if len(unique) == 1 else jnp.asarray(batch_index, jnp.int32)
  plan = plan_lib.PopulationPlan(job.task, index, mesh=mesh)
  pop = jax.jit(pop_lib.init, static_argnums=0)(job.task, _keys(jnp.asarray(seeds)), hparams,
                                                job.sample)
  os.makedirs(workdir)
  try:
    pop, history = fit(job.task, pop, train_data, plan=plan, hooks=population_hooks(
        config, hparams, job.data.eval(config.data.eval_batch_size)))
    summary = report.write(config, job, pop, seeds, history)
  except BaseException:
    shutil.rmtree(workdir, ignore_errors=True)
    raise
  return summary
