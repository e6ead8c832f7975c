"""The configurations :func:`purax.plan.fit_memory` compiles: remat policy,
microbatches, FSDP on a mesh, precision; and which one saves more than another.

A :class:`Candidate` names one configuration and makes it: :meth:`Candidate.task`
clones the task's model with the remat policy and precision (a flax.linen
module with ``remat`` / ``dtype`` / ``param_dtype`` fields, as
:mod:`purax.nn`'s models have) and replaces its microbatches;
:meth:`Candidate.mesh` lays the mesh's devices out for data parallelism or
FSDP. :func:`candidates` lists them from the least to the most memory-saving.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh

from purax import parallel
from purax.core.errors import ConfigError, expect, expect_kind
from purax.core.precision import get_policy
from purax.core.task import Task

#: Remat policies tried by default, from the least to the most memory-saving.
REMAT = ('none', 'dots_with_no_batch_dims_saveable', 'full')

#: Microbatch counts tried by default (those that divide the batch).
MICROBATCHES = (1, 2, 4, 8)

#: The initial loss scale given to a float16 candidate of a task without one
#: (the command line's ``--loss-scale`` default).
LOSS_SCALE = 2.0 ** 15


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One configuration of the step.

  Attributes:
    remat: the model's remat policy, or None (a model without one).
    microbatches: gradient accumulation steps per update (``Task.microbatches``).
    fsdp: on a mesh, parameters and optimizer state split over the batch
      axes (True) or replicated (False); None without a mesh.
    precision: a policy name or spec (:func:`purax.core.precision.get_policy`),
      or None: the model's own.
  """

  remat: str | None = None
  microbatches: int = 1
  fsdp: bool | None = None
  precision: str | None = None

  def __str__(self) -> str:
    parts = [] if self.remat is None else [f'remat={self.remat}']
    parts.append(f'microbatches={self.microbatches}')
    if self.fsdp is not None:
      parts.append('fsdp' if self.fsdp else 'data parallel')
    if self.precision is not None:
      parts.append(f'precision={self.precision}')
    return ' '.join(parts)

  def task(self, task: Task) -> Task:
    """``task`` in this configuration (its model cloned with this remat policy
    and precision, its microbatches replaced)."""
    changes = {}
    if self.remat is not None:
      changes['remat'] = self.remat
    policy = None
    if self.precision is not None:
      policy = get_policy(self.precision)
      changes.update(policy.model_kwargs())
    model = task.model.clone(**changes) if changes else task.model
    loss_scale = task.loss_scale
    if policy is not None:
      loss_scale = (loss_scale or LOSS_SCALE) if policy.needs_loss_scaling else None
    return dataclasses.replace(task, model=model, microbatches=self.microbatches,
                               loss_scale=loss_scale)

  def mesh(self, mesh: Mesh | None) -> Mesh | None:
    """``mesh``'s devices with the batch axes (``data`` x ``fsdp``) merged into
    ``fsdp`` (FSDP) or ``data`` (data parallel); ``tensor`` kept."""
    if mesh is None or self.fsdp is None:
      return mesh
    shape = dict(mesh.shape)
    batch = shape.get('data', 1) * shape.get('fsdp', 1)
    sizes = {'data': 1, 'fsdp': batch} if self.fsdp else {'data': batch, 'fsdp': 1}
    return parallel.make_mesh(**sizes, tensor=shape.get('tensor', 1),
                              devices=list(mesh.devices.flat))


def _fields(model) -> set[str]:
  return {f.name for f in dataclasses.fields(model)} if isinstance(model, nn.Module) else set()


def _has_batch_statistics(task: Task, batch) -> bool:
  state = task.abstract_state(batch)
  return any(np.issubdtype(x.dtype, np.floating) for x in jax.tree.leaves(state.model_state))


def _batch_devices(mesh: Mesh | None) -> int:
  if mesh is None:
    return 1
  shape = dict(mesh.shape)
  return shape.get('data', 1) * shape.get('fsdp', 1)


def candidates(task: Task, batch, *, mesh: Mesh | None = None,
               remat: Sequence[str] | None = None, microbatches: Sequence[int] | None = None,
               precision: Sequence[str] | None = None) -> list[Candidate]:
  """The candidates :func:`purax.plan.fit_memory` tries, from the least to the most
  memory-saving (arguments as there).

  Raises:
    ConfigError: a choice the task cannot take (remat for a model without a
      ``remat`` field, a precision for one without ``dtype``, microbatches
      that do not divide the batch or its share per device, a policy name
      that is unknown), naming it.
  """
  return grid(*axes(task, batch, mesh, remat, microbatches, precision))


def axes(task, batch, mesh, remat, microbatches, precision):
  """The resolved choices of each axis, least memory-saving first."""
  fields = _fields(task.model)
  size = int(np.shape(jax.tree.leaves(batch)[0])[0])
  per = _batch_devices(mesh)
  if remat is None:
    remat = REMAT if 'remat' in fields else (None,)
  else:
    expect('remat' in fields, 'remat', f'None for {type(task.model).__name__} (it has no remat '
           'field)', tuple(remat), ConfigError)
    remat = tuple(dict.fromkeys(remat))
  expect(len(remat) >= 1, 'remat', 'at least one policy', remat, ConfigError)
  if microbatches is None:
    fixed = task.couples_examples or _has_batch_statistics(task, batch)
    microbatches = (1,) if fixed else tuple(k for k in MICROBATCHES
                                            if size % k == 0 and (size // k) % per == 0)
  else:
    microbatches = tuple(microbatches)
    for k in microbatches:
      expect_kind(k, 'microbatches', (int, np.integer), 'integers >= 1')
      expect(k >= 1 and size % k == 0 and (size // k) % per == 0, 'microbatches',
             f'counts that divide the batch of {size} into microbatches each a multiple of '
             f'the {per} batch devices', k, ConfigError)
  expect(len(microbatches) >= 1, 'microbatches', 'at least one count', microbatches,
         ConfigError)
  if precision is None:
    precision = (None,)
  else:
    expect({'dtype', 'param_dtype'} <= fields, 'precision', f'None for '
           f'{type(task.model).__name__} (it has no dtype / param_dtype fields)',
           tuple(precision), ConfigError)
    precision = tuple(dict.fromkeys(precision))
    expect(len(precision) >= 1, 'precision', 'at least one policy', precision, ConfigError)
    for p in precision:
      get_policy(p)
  fsdp = (None,) if mesh is None else ((False, True) if per > 1 else (False,))
  return remat, tuple(sorted(set(int(k) for k in microbatches))), fsdp, precision


def grid(remat, ks, fsdp, precision) -> list[Candidate]:
  grid = [Candidate(r, k, f, p) for p in precision
          for r, k, f in itertools.product(remat, ks, fsdp)]
  return sorted(grid, key=lambda c: (sum(_ranks(c, remat, ks)), precision.index(c.precision)))


def _ranks(c: Candidate, remat: Sequence, ks: Sequence[int]) -> tuple[int, int, int]:
  """How memory-saving ``c`` is on each axis (higher: more): its place in
  ``remat``'s order and among the microbatch counts ``ks``, and FSDP."""
  return (list(remat).index(c.remat), list(ks).index(c.microbatches), int(bool(c.fsdp)))


def dominates(c: Candidate, d: Candidate, remat: Sequence, ks: Sequence[int]) -> bool:
  """``c`` saves at least as much as ``d`` on every axis, at the same precision."""
  return c.precision == d.precision and c != d and all(
      a >= b for a, b in zip(_ranks(c, remat, ks), _ranks(d, remat, ks)))
