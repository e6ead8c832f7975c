"""``shard(tree, mesh, rules)``: place a TrainState or a batch on a mesh.

The shardings are computed from shapes only (concrete arrays or
``jax.ShapeDtypeStruct`` from ``jax.eval_shape``), so the same functions give
the ``in_shardings`` / ``out_shardings`` of the jitted step and the placement
of the arrays themselves.

Example (8 devices):
  >>> mesh = parallel.make_mesh(data=4, fsdp=2)
  >>> rules = parallel.fsdp(min_size=1024)
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
  >>> state = parallel.shard(task.init(jax.random.key(0), batch), mesh, rules)
  >>> on_mesh = parallel.shard(batch, mesh, rules)
  >>> state, metrics = jax.jit(task.step)(state, on_mesh)   # runs FSDP

Tensor parallel needs the logical axis names of the parameters, which flax
keeps in ``nn.LogicallyPartitioned`` boxes that :meth:`purax.Task.init`
removes; :func:`logical_axes` recovers them abstractly (nothing is computed).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from purax.core.errors import ConfigError, expect
from purax.core.model import Linen, select_inputs
from purax.core.state import TrainState
from purax.core.task import Task
from purax.parallel.rules import Rules, array_spec, batch_spec

PyTree = Any


def replicated(mesh: Mesh) -> NamedSharding:
  """The fully replicated sharding of ``mesh`` (``PartitionSpec()``)."""
  return NamedSharding(mesh, P())


def logical_axes(task: Task, batch: Mapping[str, Any]) -> TrainState:
  """The logical axis names of every array of ``task.init``'s state.

  Parameters get the names of their ``nn.with_logical_partitioning``
  annotation; optimizer-state arrays derived from a parameter (Adam's ``mu``
  and ``nu``) get the same names, because optax maps over flax's boxes;
  everything else gets ``PartitionSpec()``. Evaluated with ``jax.eval_shape``:
  no device work.

  Args:
    task: the task; batch: a sample batch (only shapes matter).

  Returns:
    A :class:`TrainState` whose leaves are ``PartitionSpec`` of logical names.
  """
  key = jax.random.key(0)
  abstract = jax.eval_shape(task.init, key, batch)
  model = task.pure_model
  expect(isinstance(model, Linen), 'model',
         'a flax.linen module for logical axes (nn.with_logical_partitioning); other '
         'models shard by data_parallel() or fsdp() rules', type(model).__name__, ConfigError)

  def boxed_params(k):
    return model.module.init({'params': k, 'dropout': k}, select_inputs(batch, model.inputs),
                             **model._kwargs(train=False, batch=batch, hparams=None))['params']

  boxed = jax.eval_shape(boxed_params, key)
  boxed_opt = jax.eval_shape(task.tx.init, boxed)
  logical = {f: jax.tree.map(lambda _: P(), tree) for f, tree in _fields(abstract).items()}
  logical.update(params=nn.get_partition_spec(boxed),
                 opt_state=nn.get_partition_spec(boxed_opt))
  return abstract.replace(**logical)


#: The state fields split by the rules; every other field is replicated, so a
#: new field of TrainState needs no edit here.
PARTITIONED = ('params', 'opt_state')


def _fields(state) -> dict:
  """The pytree fields of a (flax struct) state, by name."""
  return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)
          if f.metadata.get('pytree_node', True)}


def tree_shardings(tree: PyTree, mesh: Mesh, rules: Rules, *,
                   logical: PyTree | None = None, prefix: str = 'tree') -> PyTree:
  """Shardings of a parameter-like tree (params, optimizer state, any pytree).

  Args:
    tree: arrays or ``ShapeDtypeStruct``; logical: the same structure with
      ``PartitionSpec`` leaves of logical names, or None.
    prefix: the tree's name in error messages.

  Raises:
    ConfigError: see :func:`purax.parallel.rules.array_spec`.
  """
  rules.check(mesh)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
  if logical is None:
    names = [None] * len(leaves)
  else:
    names = treedef.flatten_up_to(logical)
  out = [NamedSharding(mesh, array_spec(getattr(x, 'shape', ()), name, mesh, rules,
                                        path=prefix + jax.tree_util.keystr(path)))
         for (path, x), name in zip(leaves, names)]
  return jax.tree.unflatten(treedef, out)


def state_shardings(state: TrainState, mesh: Mesh, rules: Rules, *,
                    logical: TrainState | None = None) -> TrainState:
  """The :class:`jax.sharding.NamedSharding` of every array of a state.

  ``params`` and ``opt_state`` (:data:`PARTITIONED`) follow the rules; every
  other field — ``step``, ``rng``, ``hparams``, ``model_state`` (batch
  statistics), ``guards`` (the loss scale, the spike window), any field added later —
  is replicated.

  Args:
    state: a concrete or abstract (``jax.eval_shape``) state.
    logical: :func:`logical_axes` of the task; required by tensor-parallel rules.

  Raises:
    ConfigError: tensor-parallel rules without ``logical``; an unknown mesh axis.
  """
  expect(not (rules.uses_logical and logical is None), 'logical',
         'the logical axes of the state, parallel.logical_axes(task, batch), for '
         'tensor-parallel rules', None, ConfigError)
  repl = replicated(mesh)
  rules.check(mesh)
  out = {}
  for name, tree in _fields(state).items():
    if name in PARTITIONED:
      out[name] = tree_shardings(tree, mesh, rules,
                                 logical=None if logical is None else getattr(logical, name),
                                 prefix=f'state.{name}')
    else:
      out[name] = jax.tree.map(lambda _: repl, tree)
  return state.replace(**out)


def batch_shardings(batch: Mapping[str, Any], mesh: Mesh, rules: Rules) -> dict:
  """Shardings of a batch: every array split along its leading (batch) axis.

  Raises:
    DataError: a global batch size not divisible by the batch axes' size,
      naming the field, the expected multiple and the actual size.
    ConfigError: ``rules.batch_axes`` names an axis the mesh lacks.
  """
  rules.check(mesh)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: NamedSharding(mesh, batch_spec(
          jax.numpy.shape(x), mesh, rules, field=f'batch{jax.tree_util.keystr(path)}')),
      batch)


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
  """One sharding for every array of any batch: the leading axis split over the
  batch axes, the rest replicated.

  A pytree prefix: ``jax.jit(f, in_shardings=(..., batch_sharding(mesh, rules)))``
  and ``jax.device_put(batch, batch_sharding(mesh, rules))`` accept every batch
  pytree whose leaves have a leading batch axis (``{'x', 'y'}``, with
  ``'weight'``, or any other structure). Sizes are checked where the batch is
  placed (:func:`batch_shardings`, :meth:`purax.parallel.ShardedPlan.shard_batch`).

  Raises:
    ConfigError: ``rules.batch_axes`` names an axis the mesh lacks.
  """
  rules.check(mesh)
  axes = tuple(a for a in rules.batch_axes if mesh.shape[a] > 1)
  return NamedSharding(mesh, P(axes if len(axes) > 1 else axes[0]) if axes else P())


def _is_batch(tree) -> bool:
  return isinstance(tree, Mapping) and 'x' in tree


def shardings(tree: PyTree, mesh: Mesh, rules: Rules, *,
              logical: PyTree | None = None) -> PyTree:
  """:func:`state_shardings`, :func:`batch_shardings` (a dict with ``'x'``) or
  ``tree_shardings``, by the kind of ``tree``."""
  if isinstance(tree, TrainState):
    return state_shardings(tree, mesh, rules, logical=logical)
  if _is_batch(tree):
    return batch_shardings(tree, mesh, rules)
  return tree_shardings(tree, mesh, rules, logical=logical)


def shard(tree: PyTree, mesh: Mesh, rules: Rules, *, logical: PyTree | None = None) -> PyTree:
  """Places a TrainState, a batch or a parameter tree on ``mesh`` by ``rules``.

  Single-process placement (``jax.device_put``). With several processes, build
  states with :meth:`purax.parallel.ShardedPlan.init_state` and batches with
  :func:`purax.parallel.distributed.global_batch`, which never need the whole
  array on one host.

  Args:
    tree: a :class:`TrainState`; a batch ``{'x': [batch, ...], 'y': [batch, ...],
      'weight'?: [batch]}`` (global batch); or any pytree of arrays.
    mesh: from :func:`purax.parallel.make_mesh`.
    rules: e.g. :func:`purax.parallel.fsdp`.
    logical: for tensor parallel, :func:`logical_axes` (for a state) or the
      matching tree of logical ``PartitionSpec`` (for params).

  Returns:
    The same tree, every array a global ``jax.Array`` on ``mesh``; a state or
    parameter tree in new buffers (never the caller's, which a donated step
    would delete).

  Raises:
    DataError: the batch size does not divide over the batch axes.
    ConfigError: rules naming an unknown mesh axis; a tensor-parallel dimension
      not divisible by its mesh axes; tensor-parallel rules without ``logical``.
  """
  # A state or parameter tree is copied even where it already has its sharding
  # (device_put would alias it): a step that donates the result must not delete
  # the caller's arrays. Batches are never donated, so they may alias.
  return jax.device_put(tree, shardings(tree, mesh, rules, logical=logical),
                        may_alias=None if _is_batch(tree) else False)


def bytes_per_device(tree: PyTree) -> dict[Any, int]:
  """Bytes of ``tree`` held by each device, read from the addressable shards."""
  out: dict[Any, int] = {}
  for x in jax.tree.leaves(tree):
    for s in x.addressable_shards:
      out[s.device] = out.get(s.device, 0) + s.data.nbytes
  return out
