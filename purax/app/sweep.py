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
The options are :class:`SweepConfig` (:mod:`purax.app.sweep_config`).
"""

from __future__ import annotations

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np

from purax import parallel
from purax import plan as plan_lib
from purax.app import job as job_lib
from purax.app import report
from purax.app.hparams import BY_STATE
from purax.app.search import members_from_specs, parse_seeds
from purax.app.sweep_config import PopulationConfig as PopulationConfig
from purax.app.sweep_config import SweepConfig as SweepConfig
from purax.app.sweep_config import SweepRunConfig as SweepRunConfig
from purax.core import population as pop_lib
from purax.core.errors import ConfigError, expect
from purax import hooks as hooks_lib
from purax.loop import fit


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
  config = config.validate().resolved()     # the population's size is bounded
  seeds, hparams = members(config)
  base = config.base(seed=int(seeds[0]))
  job = job_lib.build(base, mesh=False)
  job_lib.check_population_memory(job, len(seeds), 'members', seeds=len(np.unique(seeds)))
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
