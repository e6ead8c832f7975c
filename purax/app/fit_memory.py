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
"""

from __future__ import annotations

import dataclasses
from typing import TextIO

from jax.sharding import Mesh

from purax import parallel
from purax.app import job as job_lib
from purax.app.config import TrainConfig
from purax.core.errors import OutOfMemoryError
from purax.plan import fit_memory
from purax.plan.budget import parse_bytes
from purax.plan.candidates import Candidate
from purax.plan.memory import MemoryFit


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


def fit_config(config: TrainConfig, *, stream: TextIO | None) -> tuple[TrainConfig, MemoryFit]:
  """``config`` with the fastest configuration that fits written in, and the fit.

  Args:
    config: a validated, resolved config with ``--fit-memory``.
    stream: where the candidate table goes; None: nowhere (not process 0).

  Raises:
    OutOfMemoryError: no candidate fits the budget (the smallest is named).
    ConfigError, DataError: as ``purax train``.
  """
  data = config.data.load()
  task = job_lib.build_task(config, num_classes=data.num_classes, input_shape=data.input_shape)
  sample = data.sample(config.data.batch_size)
  mesh = mesh_of(config)
  budget = (None if config.run.memory_budget is None
            else parse_bytes(config.run.memory_budget, 'memory_budget'))
  try:
    fit = fit_memory(task, sample, mesh=mesh, budget_bytes=budget, stream=stream,
                     quiet=stream is None,
                     **choices(config))
  except OutOfMemoryError as e:   # named by the command line's option
    raise OutOfMemoryError(str(e).replace('budget_bytes:', 'memory_budget:', 1)) from None
  return with_candidate(config, fit.chosen, mesh), fit


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
