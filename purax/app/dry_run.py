"""``purax train --dry-run``: everything a run does before its first step, then stop.

Validates the config, loads the data, builds the task, traces the state
(``jax.eval_shape``: nothing is allocated), lowers and compiles the train
step exactly as the run would (on its mesh when ``--mesh`` is given), prints
the model summary and the compiled step's FLOPs and memory from XLA's own
analyses, and returns. With ``--fit-memory`` (on a new run directory) it
first fits the step in memory as the run would (:mod:`purax.app.fit_memory`),
prints the candidate table, and reports the chosen configuration. No run
directory, checkpoint or log is written.
"""

from __future__ import annotations

import sys
from typing import TextIO

import jax

from purax.app import job as job_lib
from purax.app import fit_memory
from purax.app import rundir as rundir_lib
from purax.app.config import TrainConfig
from purax.app.optimizers import OPTIMIZERS
from purax.core import lazy
from purax.inspect import summary as summary_lib


def print_summary(state, *, shardings=None,
                  stream: TextIO | None = None) -> summary_lib.Summary:
  """Prints :func:`purax.inspect.summary.format_summary` of ``state`` (abstract or
  real; to stderr by default), its bytes per device under ``shardings`` (a tree
  of ``jax.sharding.Sharding`` like ``state``) when given, and then, as
  ``purax.summary`` shows it, a row per parameter with its PartitionSpec."""
  if shardings is not None:
    state = summary_lib.with_shardings(state, shardings)
  info = summary_lib.summarize(state)
  print(summary_lib.format_summary(info, per_parameter=shardings is not None),
        file=sys.stderr if stream is None else stream)
  return info


def dry_run(config: TrainConfig, *, stream: TextIO | None = None) -> dict:
  """Builds and compiles ``config``'s train step without training or writing.

  Args:
    config: the run's config (``workdir`` may name an existing run: it is
      only read, never written).
    stream: where the summary goes (default ``sys.stdout``).

  Returns:
    ``{'params', 'state_bytes_per_device', 'flops', 'temp_bytes', ...}``
    (:func:`purax.inspect.summary.compiled_cost`), and with ``--fit-memory``
    ``'fit_memory': {'chosen', 'flags', 'budget_bytes', 'candidates', 'compiled'}``.

  Raises:
    ConfigError, DataError: as ``purax train`` would, before compiling;
      also when ``workdir`` holds a run that this config may not resume (a
      field that changes the computation differs from its ``config.json``).
    FileExistsError: ``workdir`` holds something other than a purax run.
    OutOfMemoryError: with ``--fit-memory``, no candidate fits the budget.
  """
  stream = sys.stdout if stream is None else stream
  config = config.validate().resolved()
  fitted = None
  if rundir_lib.holds_run(config.run.workdir):
    # The run would resume this directory: the same check it makes.
    config.check_resumable(rundir_lib.read_config(config.run.workdir))
  elif config.run.fit_memory:
    config, fitted = fit_memory.fit_config(config, stream=stream)
  job = job_lib.build(config)
  state = job.abstract['state']
  if fitted is not None:   # the chosen step is compiled already
    cost = dict(fitted.row.cost)
  else:
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), job.sample)
    lowered = job.plan.lower(state, job.abstract['train_metrics'], batch)
    cost = summary_lib.compiled_cost(lowered.compile())
  info = print_summary(state, shardings=job.plan.state_sharding, stream=stream)
  leaf_table = lazy.resolve(OPTIMIZERS[config.optimizer.name].leaf_table)
  if leaf_table is not None:   # which leaf gets which part of the optimizer (Muon's)
    print(f'{config.optimizer.name}: which leaf goes where\n{leaf_table(state.params)}',
          file=stream)
  print(summary_lib.format_cost(cost), file=stream)
  print(f'dry run of {config.model.name} on {config.data.name}: {config.run.steps} steps of '
        f'batch {config.data.batch_size} would run in {config.run.workdir}; nothing written',
        file=stream)
  out = {'params': info.total_params,
         'state_bytes_per_device': info.bytes_per_device['total'], **cost}
  if fitted is not None:
    out['fit_memory'] = {'chosen': str(fitted.chosen), 'flags': fit_memory.flags(
        fitted.chosen, fit_memory.mesh_of(config)), 'budget_bytes': fitted.budget_bytes,
        'candidates': len(fitted.rows),
        'compiled': sum(r.cost is not None for r in fitted.rows)}
  return out
