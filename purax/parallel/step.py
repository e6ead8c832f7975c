"""The jitted step on a mesh: ``in_shardings`` / ``out_shardings``, state donated.

:func:`sharded` computes, once, the shardings of the task's state and batch
under some rules, and jits ``init``, ``step``, a metrics-accumulating
``train_step`` and ``evaluate`` with them. The step is :meth:`purax.Task.step`
itself: data parallel, FSDP and tensor parallel differ only in the shardings
handed to ``jax.jit`` (GSPMD inserts the collectives).

Example::

  mesh = parallel.make_mesh(data=4, fsdp=2)
  plan = parallel.sharded(task, mesh, parallel.fsdp(), sample_batch)
  state = plan.init(jax.random.key(0))             # born sharded
  for batch in batches:
    state, metrics = plan.step(state, plan.shard_batch(batch))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import jax
from jax.sharding import Mesh, NamedSharding

from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, expect
from purax.core.state import TrainState
from purax.core.task import Task
from purax.parallel import distributed
from purax.parallel.rules import Rules
from purax.parallel.shard import (batch_sharding, batch_shardings, logical_axes, replicated,
                                  state_shardings)


@dataclasses.dataclass(frozen=True)
class Sharded:
  """A task's compiled functions on one mesh, with their shardings.

  Attributes:
    task, mesh, rules: what it was built from.
    state_sharding: a :class:`TrainState` of ``NamedSharding``.
    batch_sharding: one ``NamedSharding`` (leading axis split over the batch
      axes) that applies, as a pytree prefix, to every array of any batch:
      training batches, padded evaluation batches with ``'weight'``, or any
      other batch structure the task accepts.
    sample_batch: the batch whose shapes fixed the plan.
    init: ``key -> state``, the state created directly in its sharding (no
      device ever holds an unsharded FSDP parameter).
    step: ``(state, batch) -> (state, metrics)``; ``state`` is donated.
    train_step: ``(state, acc, batch) -> (state, acc)``, metrics merged into
      ``acc`` on the device; ``state`` and ``acc`` donated (as in ``fit``).
    evaluate: ``(state, batch) -> metrics`` of one batch (any structure,
      e.g. :func:`purax.io.pipeline.eval_batches`' padded ones).
  """

  task: Task
  mesh: Mesh
  rules: Rules
  state_sharding: TrainState
  batch_sharding: NamedSharding
  sample_batch: Mapping[str, Any]
  init: Callable
  step: Callable
  train_step: Callable
  evaluate: Callable

  def shard_state(self, state: TrainState) -> TrainState:
    """Places an existing state (e.g. a restored one) on the mesh, in new
    buffers: donating the result to :attr:`step` leaves ``state`` usable."""
    return jax.device_put(state, self.state_sharding, may_alias=False)

  def shard_batch(self, batch: Mapping[str, Any]) -> dict:
    """Places a global batch (the same on every process) on the mesh.

    Raises:
      DataError: a batch size not divisible by the batch axes.
    """
    return jax.device_put(batch, batch_shardings(batch, self.mesh, self.rules))

  def evaluate_batches(self, state: TrainState, batches: Iterable) -> dict[str, float]:
    """Metrics over all ``batches`` (padded ones carry ``weight``), as numbers.

    Each global batch is placed on the mesh (with several processes, each
    feeds its rows, as in :func:`purax.loop.fit`) and evaluated by the
    compiled :attr:`evaluate`; the metrics merge on the device and are fetched
    once at the end.

    Raises:
      ConfigError: ``batches`` is empty.
      DataError: a batch size not divisible by the batch axes.
    """
    acc = None
    for batch in batches:
      if jax.process_count() > 1:
        rows = distributed.process_rows(self.mesh, self.rules,
                                        len(jax.tree.leaves(batch)[0]))
        placed = distributed.global_batch(jax.tree.map(lambda v: v[rows], batch),
                                          self.mesh, self.rules)
      else:
        placed = self.shard_batch(batch)
      metrics = self.evaluate(state, placed)
      acc = metrics if acc is None else _merge(acc, metrics)
    expect(acc is not None, 'eval batches', 'at least one batch', 'none', ConfigError)
    return metrics_lib.compute(acc)


def sharded(task: Task, mesh: Mesh, rules: Rules, sample_batch: Mapping[str, Any], *,
            logical: TrainState | None = None) -> Sharded:
  """Builds the jitted ``init`` / ``step`` / ``evaluate`` of ``task`` on ``mesh``.

  Args:
    task: the task.
    mesh: from :func:`purax.parallel.make_mesh`.
    rules: :func:`~purax.parallel.data_parallel`, :func:`~purax.parallel.fsdp`
      or :func:`~purax.parallel.tensor_parallel` (or any :class:`Rules`).
    sample_batch: a global batch (``{'x': [batch, ...], 'y': [batch, ...]}``);
      only its shapes and dtypes matter.
    logical: the state's logical axes; default :func:`logical_axes` when the
      rules are tensor parallel.

  Returns:
    A :class:`Sharded` plan.

  Raises:
    DataError: a malformed batch, or a batch size not divisible by the batch axes.
    ConfigError: rules naming an unknown mesh axis, or a tensor-parallel dimension
      that does not divide.
  """
  if logical is None and rules.uses_logical:
    logical = logical_axes(task, sample_batch)
  abstract = jax.eval_shape(task.init, jax.random.key(0), sample_batch)
  s_state = state_shardings(abstract, mesh, rules, logical=logical)
  batch_shardings(sample_batch, mesh, rules)     # checks the batch size, naming the field
  s_batch = batch_sharding(mesh, rules)          # one prefix for every batch pytree
  repl = replicated(mesh)
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), sample_batch)

  init = jax.jit(lambda key: task.init(key, shapes_to_zeros(shapes)),
                 out_shardings=s_state)
  step = jax.jit(task.step, in_shardings=(s_state, s_batch),
                 out_shardings=(s_state, repl), donate_argnums=0)

  def _train_step(state, acc, batch):
    state, metrics = task.step(state, batch)
    return state, metrics_lib.merge(acc, metrics)

  train_step = jax.jit(_train_step, in_shardings=(s_state, repl, s_batch),
                       out_shardings=(s_state, repl), donate_argnums=(0, 1))
  evaluate = jax.jit(task.evaluate, in_shardings=(s_state, s_batch), out_shardings=repl)
  return Sharded(task=task, mesh=mesh, rules=rules, state_sharding=s_state,
                 batch_sharding=s_batch, sample_batch=sample_batch, init=init, step=step,
                 train_step=train_step, evaluate=evaluate)


_merge = jax.jit(metrics_lib.merge)


def shapes_to_zeros(shapes):
  """Zeros of a tree of ``ShapeDtypeStruct`` (inside jit: free, shapes only)."""
  return jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype), shapes)
