"""``purax train --dry-run``: everything a run does before its first step, then stop.

Validates the config, loads the data, builds the task, traces the state
(``jax.eval_shape``: nothing is allocated), lowers and compiles the train
step exactly as the run would (on its mesh when ``--mesh`` is given), prints
the model summary and the compiled step's FLOPs and memory from XLA's own
analyses, and returns. No run directory, checkpoint or log is written.
"""

from __future__ import annotations

import sys
from typing import TextIO

import jax

from purax.config import TrainConfig, sample_batch
from purax.core import summary as summary_lib
from purax.io import profile


def print_summary(state, *, shardings=None,
                  stream: TextIO | None = None) -> summary_lib.Summary:
  """Prints :func:`purax.core.summary.format_summary` of ``state`` (abstract or
  real; to stderr by default), its bytes per device under ``shardings`` (a tree
  of ``jax.sharding.Sharding`` like ``state``) when given."""
  if shardings is not None:
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         state, shardings)
  info = summary_lib.summarize(state)
  print(summary_lib.format_summary(info), file=sys.stderr if stream is None else stream)
  return info


def dry_run(config: TrainConfig, *, stream: TextIO | None = None) -> dict:
  """Builds and compiles ``config``'s train step without training or writing.

  Args:
    config: the run's config (``workdir`` may name an existing run: it is
      only read, never written).
    stream: where the summary goes (default ``sys.stdout``).

  Returns:
    ``{'params', 'state_bytes_per_device', 'flops', 'temp_bytes', ...}``
    (:func:`purax.core.summary.compiled_cost`).

  Raises:
    ConfigError, DataError: as ``purax train`` would, before compiling.
  """
  from purax import parallel, runs
  from purax.loop import train_step
  stream = sys.stdout if stream is None else stream
  config = config.validate()
  if config.profile is not None:
    profile.parse_range(config.profile)
  config, ds, task, _ = runs._prepare(config)   # pylint: disable=protected-access
  sample = sample_batch(ds.x_train, ds.y_train, config.batch_size)
  abstract = runs.abstract_checkpoint(task, sample)
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), sample)
  state, acc = abstract['state'], abstract['train_metrics']
  if config.mesh is not None:
    mesh = parallel.make_mesh(**parallel.parse_mesh(config.mesh))
    plan = parallel.sharded(task, mesh, parallel.for_mesh(mesh), sample)
    with_sharding = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
    state = jax.tree.map(with_sharding, state, plan.state_sharding)
    batch = jax.tree.map(lambda x: with_sharding(x, plan.batch_sharding), batch)
    lowered = plan.train_step.lower(state, acc, batch)
  else:
    lowered = train_step.lower(task, state, acc, batch)
  cost = summary_lib.compiled_cost(lowered.compile())
  info = print_summary(state, stream=stream)
  print(summary_lib.format_cost(cost), file=stream)
  print(f'dry run of {config.model} on {config.dataset}: {config.steps} steps of batch '
        f'{config.batch_size} would run in {config.workdir}; nothing written', file=stream)
  return {'params': info.total_params,
          'state_bytes_per_device': info.bytes_per_device['total'], **cost}
