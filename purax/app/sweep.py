"""``purax sweep``: many training runs of one task, trained at once as a population.

Every member of a grid or random search trains in one compiled program
(:mod:`purax.core.population`), whatever the values: the same job as
``purax train`` (any model and data set of the tables, ``--precision``,
``--mesh``), built once by :func:`purax.app.job.build`, with each optimizer
or loss hyperparameter of :data:`purax.app.hparam_table.HPARAMS` a search spec.
Each member ``i`` reads the batches of its own seed (members that share a
seed share batches), so member ``i`` computes what ``purax train`` computes
with member ``i``'s hyperparameters and seed. The loop is :func:`purax.fit`
(a :class:`purax.plan.PopulationPlan` and :func:`population_hooks`). At the end the report
(:mod:`purax.app.report`) ranks the members, writes ``sweep.json`` and
``curves.png`` and saves the best member as an ordinary run in ``WORKDIR/best``.
The options are :class:`SweepConfig` (:mod:`purax.app.sweep_config`).
"""

from __future__ import annotations

import json
import signal
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np

from purax import parallel
from purax import plan as plan_lib
from purax.app import fork as fork_lib
from purax.app import job as job_lib
from purax.app import jobdir as jobdir_lib
from purax.app import report
from purax.app import verdict as verdict_lib
from purax.app import rundir as rundir_lib
from purax.app.hparam_table import BY_STATE
from purax.app.search import members_from_specs, parse_seeds
from purax.app.sweep_config import PopulationConfig as PopulationConfig
from purax.app.sweep_config import SweepConfig as SweepConfig
from purax.app.sweep_config import SweepRunConfig as SweepRunConfig
from purax.core import metrics as metrics_lib
from purax.core import population as pop_lib
from purax.core.errors import ConfigError, expect
from purax import hooks as hooks_lib
from purax.hooks import time_budget as budget_lib
from purax.io import compile_time, signals, writers
from purax.io.checkpoint import Checkpointer
from purax.io.checkpoint.run import Restored
from purax.io.safe_files import open_file, write_atomic
from purax.io.signals import StopOnSignal
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


def population_hooks(config: SweepConfig, hparams: dict, eval_data, *, writer=None,
                     checkpointer=None, should_stop=None) -> list:
  """The sweep's hooks: logging and evaluation, per-member early stopping
  (``--patience``) and PBT (``--pbt-every``), ranked by ``--metric``; with a
  ``checkpointer``, a checkpoint every ``--log-every`` steps and at a stop
  (``should_stop``, polled after every step).

  Raises:
    ConfigError: ``pbt_every`` not a multiple of ``eval_every``.
  """
  population, run = config.population, config.run
  mode = population.best().mode
  hooks = hooks_lib.standard(log_every=run.log_every, eval_data=eval_data,
                             eval_every=run.eval_every, max_consecutive_skips=None,
                             progress=run.progress, writer=writer, checkpointer=checkpointer,
                             checkpoint_every=run.log_every if checkpointer else 0,
                             should_stop=should_stop)
  if population.patience:
    hooks.append(hooks_lib.PopulationEarlyStopping(metric=population.metric, mode=mode,
                                                   patience=population.patience))
  if run.time_budget is not None:
    # The report (sweep.json, curves.png, best/) is written inside the budget too.
    hooks.append(job_lib.time_budget(run.time_budget, eval_data, report_s=REPORT_S))
  if population.pbt_every:
    pbt = hooks_lib.PBT(every=population.pbt_every, metric=population.metric, mode=mode,
                        fraction=population.pbt_fraction,
                        key=jax.random.key(population.sample_seed),
                        names=report.swept(hparams) or ('learning_rate',),
                        bounds={name: BY_STATE[name].clip_bounds() for name in hparams
                                if name in BY_STATE})
    pbt.check(run.eval_every)
    hooks.append(pbt)
  return hooks


def run(config: SweepConfig) -> dict:
  """Runs a sweep end to end, or resumes it; returns the summary written to ``sweep.json``.

  Writes ``WORKDIR/sweep_config.json``, ``checkpoints/`` (the population,
  every ``--log-every`` steps and when stopped), ``history.jsonl`` (every
  logged record), and at the end ``sweep.json`` (members sorted by the eval
  metric, their hyperparameters, status and curves), ``curves.png`` and
  ``best/`` (an ordinary run: ``config.json``, ``checkpoints/``,
  ``final_metrics.json``); with ``--time-budget`` the steps are planned to the
  budget (:class:`purax.hooks.TimeBudget`) and ``verdict.json`` is written
  after ``sweep.json`` (:func:`purax.app.verdict.of_sweep`; also for a stopped
  sweep). The same command on the same ``--workdir``
  resumes an interrupted sweep from its newest checkpoint (the same result,
  bitwise on the CPU) and returns a finished one's summary.

  A first SIGTERM/SIGINT during start-up (up to the first step's
  compilation) stops with nothing written (:class:`purax.io.signals.Stopped`);
  during training it returns ``{'stopped_by': SIGNAL, 'step': s}`` after
  committing the checkpoint of step ``s``.

  Raises:
    ConfigError, DataError: before anything is written (also when the
      directory's sweep was started with another config, naming the field);
    FileExistsError: the directory holds something else. A new sweep that
      fails before its first checkpoint removes its directory.
  """
  parent = None
  if config.population.parent is not None:     # purax sweep --from RUN[:STEP]
    parent = fork_lib.open_parent(config.population.parent,
                                  fork_lib.recorded(config.run.workdir))   # resumed: its step
    config = fork_lib.inherit(config, parent)   # the options left out: the parent's
  config = config.validate().resolved()
  with StopOnSignal() as stop, jobdir_lib.JobDir(config.run.workdir, 'sweep',
                                                 config.flat()) as jobdir:
    starting = start_phases(stop)
    if jobdir.resuming and os.path.isfile(jobdir.file('sweep.json')):
      print(f'purax: sweep {jobdir.path} is finished; nothing to train', file=sys.stderr)
      with open_file(jobdir.file('sweep.json'), encoding='utf-8') as f:
        return json.load(f)
    starting('checking the sweep directory')
    seeds, hparams = members(config)
    base = config.base(seed=int(seeds[0]))
    job = job_lib.build(base, mesh=False, phase=starting)
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
    index = None if len(unique) == 1 else jnp.asarray(batch_index, jnp.int32)
    plan = plan_lib.PopulationPlan(job.task, index, mesh=mesh)
    if parent is None:
      pop = jax.jit(pop_lib.init, static_argnums=0)(job.task, _keys(jnp.asarray(seeds)),
                                                    hparams, job.sample)
    else:
      pop = fork_lib.population(parent, job, hparams)
    starting('initialising the population')
    jobdir.create()
    if parent is not None and fork_lib.recorded(jobdir.path) is None:
      # A fork records its parent: when new, or killed before it had (no checkpoint yet).
      write_atomic(jobdir.file(fork_lib.LINEAGE),
                   json.dumps(fork_lib.lineage(parent), indent=1, sort_keys=True))
    history_path = jobdir.file(HISTORY)
    with Checkpointer(jobdir.file('checkpoints'), keep_last=2, interval_s=None) as ckpt:
      restored = _restore(ckpt, plan, pop, train_data[0])
      if restored.step:
        print(f'purax: resuming sweep {jobdir.path} from step {restored.step}', file=sys.stderr)
      rundir_lib.truncate_jsonl(history_path, restored.step)
      writer = writers.MultiWriter([writers.ConsoleWriter(), HistoryWriter(history_path)])
      hooks = population_hooks(
          config, hparams, job.data.eval(config.data.eval_batch_size), writer=writer,
          checkpointer=ckpt, should_stop=_after_start_up(stop))
      try:
        pop, history = fit(job.task, restored, train_data, plan=plan, hooks=hooks)
      finally:
        writer.close()
        if ckpt.steps():
          jobdir.committed()
    budget = next((h for h in hooks if isinstance(h, hooks_lib.TimeBudget)), None)
    by_budget = budget_lib.ended_by_budget(getattr(history, 'end', None))
    reached = plan.start_step(pop) if stop.received or by_budget else steps
    if reached < steps and not by_budget:
      if budget is not None:
        verdict_lib.write(jobdir.file(verdict_lib.VERDICT), verdict_lib.of_sweep(
            config, history.end, None, budget, compile_s=compile_time.seconds()))
      print(f'purax: stopped by {stop.received} at step {reached}; checkpoint committed in '
            f'{jobdir.file("checkpoints")}; run the same command to resume (exit status '
            f'{signals.status(signal.Signals[stop.received])})', file=sys.stderr)
      return {'stopped_by': stop.received, 'step': reached}
    shutil.rmtree(jobdir.file('best'), ignore_errors=True)   # a report cut short before
    summary = report.write(config, job, pop, seeds, read_history(history_path), reached=reached)
    if budget is not None:
      verdict_lib.write(jobdir.file(verdict_lib.VERDICT), verdict_lib.of_sweep(
          config, history.end, summary, budget, compile_s=compile_time.seconds()))
  # After the last step: the sweep was finished, and is written.
  return jobdir_lib.finished(summary, stop, 'sweep finished; its report')


#: Seconds a ``--time-budget`` keeps for the report after training (sweep.json,
#: curves.png, best/: a plot and a checkpoint on the CPU).
REPORT_S = 5.0

#: Every record the sweep logged (a line each), kept across resumes.
HISTORY = 'history.jsonl'


class HistoryWriter:
  """Appends each record (``step`` and every value, a list per member) to a
  JSON-lines file, flushed: the sweep's history across resumes."""

  def __init__(self, path: str):
    self._file = open_file(path, 'a', encoding='utf-8')

  def write_scalars(self, step, scalars):
    record = {'step': int(step)}
    for k, v in scalars.items():
      v = np.asarray(v)
      record[k] = [float(x) for x in v.ravel()] if v.ndim else float(v)
    self._file.write(json.dumps(record) + '\n')
    self._file.flush()

  def flush(self):
    self._file.flush()

  def close(self):
    self._file.close()


def read_history(path: str) -> list[dict]:
  """The records of :class:`HistoryWriter` (values as numpy arrays)."""
  with open_file(path, encoding='utf-8') as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [{k: v if k == 'step' else np.asarray(v) for k, v in r.items()} for r in records]


def _restore(ckpt, plan, pop, batch) -> Restored:
  """The newest checkpoint of the population (its structure: ``pop``'s), or ``pop``."""
  if not ckpt.steps():
    return Restored(pop, None, 0, None, {})
  window = metrics_lib.as_tree(plan.zero_metrics(pop, batch))
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          {'state': pop, 'train_metrics': window})
  tree, extra, step = ckpt.restore(abstract)
  return Restored(tree['state'], tree['train_metrics'], step,
                  extra.get('data', {}).get('iterator'), extra, tree.get('hooks'))


def start_phases(stop):
  """``starting(phase)``: raises :class:`purax.io.signals.Stopped` when ``stop`` is set."""
  def starting(phase: str) -> None:
    if stop():
      raise signals.Stopped(stop.received, f'during start-up ({phase})')
  return starting


def _after_start_up(stop):
  """``stop`` as the loop polls it: before the first call returned (its
  compilation) a signal is still start-up (nothing written)."""
  polled = False

  def poll() -> bool:
    nonlocal polled
    if not polled and stop():
      raise signals.Stopped(stop.received, 'during start-up (compiling the first step)')
    polled = True
    return stop()
  return poll
