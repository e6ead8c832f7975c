"""``purax train --fit-memory``: the run's step fitted in memory before it starts.

:func:`fit_config` builds the run's task and sample batch as ``purax train``
does, asks :func:`purax.plan.fit_memory` for the fastest configuration that
fits ``--memory-budget`` (remat policies when the model takes ``--remat``,
microbatch counts, FSDP on ``--mesh``, the precisions of
``--fit-memory-precisions``), prints the candidate table, and returns the
config with the choice written into its fields (``--remat``,
``--microbatches``, ``--precision``, ``--mesh``). Those fields must match on
resume (:mod:`purax.app.fields`), so ``config.json`` keeps the choice and a
resumed run neither fits again nor changes it. :func:`flags` spells a
candidate as the command line's options (for the message of a step that ran
out of memory).

A run on a ``--time-budget`` fits again on its own when its step runs out of
memory (:func:`refit_config`): the budget is the compiled peak of the step
that failed less :data:`purax.plan.budget.MARGIN` (and ``--memory-budget``
when given), the choice the fastest candidate under it, written into
``config.json`` as ``--fit-memory``'s is (a resumed run keeps it), and
recorded in ``WORKDIR/memory_refits.json`` (:data:`REFITS`, a JSON list,
oldest first; :func:`record_refit`, :func:`refits`), which the verdict
lists.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TextIO

from jax.sharding import Mesh

from purax import parallel
from purax.app import job as job_lib
from purax.app.config import TrainConfig
from purax.core.errors import ConfigError, OutOfMemoryError
from purax.io import safe_files
from purax.plan import fit_memory
from purax.plan import memory as plan_memory
from purax.plan.budget import parse_bytes
from purax.plan.candidates import Candidate
from purax.plan.memory import MemoryFit

#: The refits of a run on a time budget whose step ran out of memory, in its directory.
REFITS = 'memory_refits.json'


def mesh_of(config: TrainConfig) -> Mesh | None:
  """The run's device mesh (``--mesh``), or None."""
  if config.run.mesh is None:
    return None
  return parallel.make_mesh(**parallel.parse_mesh(config.run.mesh))


def mesh_spec(mesh: Mesh) -> str:
  """``'data=2,fsdp=4'``: a mesh as ``--mesh`` spells it (axes of size 1 left out)."""
  spec = ','.join(f'{axis}={size}' for axis, size in mesh.shape.items() if size > 1)
  return spec or 'data=1'


def choices(config: TrainConfig) -> dict:
  """What ``--fit-memory`` varies for this config (:func:`purax.plan.fit_memory`'s
  ``remat`` / ``microbatches`` / ``precision``: None is its default)."""
  return {'precision': config.run.precisions()}


def _parts(config: TrainConfig):
  """``(task, sample batch, mesh, --memory-budget in bytes or None)`` of ``config``."""
  data = config.data.load()
  task = job_lib.build_task(config, num_classes=data.num_classes, input_shape=data.input_shape)
  budget = (None if config.run.memory_budget is None
            else parse_bytes(config.run.memory_budget, 'memory_budget'))
  return task, data.sample(config.data.batch_size), mesh_of(config), budget


def fit_config(config: TrainConfig, *, stream: TextIO | None) -> tuple[TrainConfig, MemoryFit]:
  """``config`` with the fastest configuration that fits written in, and the fit.

  Args:
    config: a validated, resolved config with ``--fit-memory``.
    stream: where the candidate table goes; None: nowhere (not process 0).

  Raises:
    OutOfMemoryError: no candidate fits the budget (the smallest is named).
    ConfigError, DataError: as ``purax train``.
  """
  task, sample, mesh, budget = _parts(config)
  try:
    fit = fit_memory(task, sample, mesh=mesh, budget_bytes=budget, stream=stream,
                     quiet=stream is None,
                     **choices(config))
  except OutOfMemoryError as e:   # named by the command line's option
    raise OutOfMemoryError(str(e).replace('budget_bytes:', 'memory_budget:', 1)) from None
  return with_candidate(config, fit.chosen, mesh), fit


def refit_config(config: TrainConfig, error: BaseException, *, stream: TextIO | None
                 ) -> tuple[TrainConfig, dict]:
  """``config`` fitted again after its step ran out of memory, and the record
  of the refit (the module docstring).

  Args:
    config: the run's config, whose step raised ``error``.
    error: the out-of-memory error (XLA's ``RESOURCE_EXHAUSTED``, or the
      :class:`OutOfMemoryError` that names it).
    stream: where the candidate table goes; None: nowhere.

  Returns:
    ``(config, record)``: the config with the chosen candidate written in,
    and ``{'action': 'memory_refit', 'error', 'failed', 'chosen',
    'budget_bytes', 'budget'}`` (``failed`` and ``chosen``: ``remat``,
    ``microbatches``, ``precision``, ``mesh`` and the compiled ``peak_bytes``
    per device).

  Raises:
    OutOfMemoryError: no candidate fits below the step that failed (chained
      to ``error``).
  """
  task, sample, mesh, given = _parts(config)
  budget, words, failed = plan_memory.budget_below_failure(task, sample, mesh=mesh,
                                                           budget_bytes=given)
  said = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
  try:
    fit = fit_memory(task, sample, mesh=mesh, budget_bytes=budget, quiet=True,
                     **choices(config))
  except OutOfMemoryError as e:
    raise OutOfMemoryError(f'{said}; fitting the step again below it ({words}): '
                           f'{str(e).replace("budget_bytes:", "memory_budget:", 1)}') from error
  if stream is not None:
    print(dataclasses.replace(fit, budget_source=words).table(), file=stream)
  fitted = with_candidate(config, fit.chosen, mesh)
  return fitted, {'action': 'memory_refit', 'error': said,
                  'failed': {**fields(config), 'peak_bytes': failed},
                  'chosen': {**fields(fitted), 'peak_bytes': fit.row.peak_bytes},
                  'budget_bytes': budget, 'budget': words}


def fields(config: TrainConfig) -> dict:
  """The fields ``--fit-memory`` chooses: ``remat``, ``microbatches``, ``precision``, ``mesh``."""
  return {'remat': config.model.remat, 'microbatches': config.optimizer.microbatches,
          'precision': config.model.precision, 'mesh': config.run.mesh}


def record_refit(workdir: str, record: dict) -> None:
  """Appends ``record`` to the run's :data:`REFITS` (written atomically)."""
  safe_files.write_atomic(os.path.join(workdir, REFITS),
                          json.dumps(refits(workdir) + [record], indent=2))


def refits(workdir: str) -> list[dict]:
  """The refits recorded in ``workdir`` (:data:`REFITS`), oldest first; [] when none
  (an unreadable file: one entry saying so, never an error)."""
  path = os.path.join(workdir, REFITS)
  if not os.path.lexists(path):
    return []
  try:
    with safe_files.open_file(path, encoding='utf-8') as f:
      out = json.load(f)
    if not isinstance(out, list):
      raise ValueError(f'a JSON list expected, got {type(out).__name__}')
    return out
  except (OSError, ValueError, ConfigError) as e:
    return [{'action': 'memory_refit', 'unreadable': f'{path}: {type(e).__name__}: {e}'}]


def with_candidate(config: TrainConfig, candidate: Candidate, mesh: Mesh | None) -> TrainConfig:
  """``config`` with ``candidate``'s remat, microbatches, precision and mesh."""
  model, optimizer, run = config.model, config.optimizer, config.run
  if candidate.remat is not None:
    model = dataclasses.replace(model, remat=candidate.remat)
  if candidate.precision is not None:
    model = dataclasses.replace(model, precision=candidate.precision)
  optimizer = dataclasses.replace(optimizer, microbatches=candidate.microbatches)
  if candidate.fsdp is not None:
    run = dataclasses.replace(run, mesh=mesh_spec(candidate.mesh(mesh)))
  return dataclasses.replace(config, model=model, optimizer=optimizer, run=run)


def flags(candidate: Candidate, mesh: Mesh | None = None) -> str:
  """``'--remat full --microbatches 2'``: a candidate as ``purax train``'s options."""
  out = [] if candidate.remat is None else [f'--remat {candidate.remat}']
  out.append(f'--microbatches {candidate.microbatches}')
  if candidate.precision is not None:
    out.append(f'--precision {candidate.precision}')
  if candidate.fsdp is not None:
    out.append(f'--mesh {mesh_spec(candidate.mesh(mesh))}')
  return ' '.join(out)
