"""What is stored for a pytree: typed keys as key data, small leaves as host
copies, the signature (path, shape, dtype) of every leaf, and the shardings a
checkpoint is restored onto."""

from __future__ import annotations

import dataclasses
import numbers
import reprlib
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from purax.core import hparams as hparams_lib
from purax.core.errors import CheckpointError, CheckpointMismatchError
from purax.core.state import LEGACY_GUARD_FIELDS, TrainState

PyTree = Any


# -- typed keys <-> key data ------------------------------------------------


def is_typed_key(x) -> bool:
  return hasattr(x, 'dtype') and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def key_impl(x):
  # Works for concrete keys and for jax.ShapeDtypeStruct targets alike.
  return x.dtype._impl  # pylint: disable=protected-access


def storable(tree: PyTree) -> PyTree:
  return jax.tree.map(lambda x: jax.random.key_data(x) if is_typed_key(x) else x, tree)


# Leaves up to this size are handed to orbax as host numpy copies (one process
# only) and fingerprinted by numpy.
HOST_LEAF_BYTES = 1 << 20


def small_whole(x) -> bool:
  """Whether ``x`` is a ``jax.Array`` this process holds whole, of at most
  ``HOST_LEAF_BYTES``: cheap to copy to the host and handle there."""
  return isinstance(x, jax.Array) and x.is_fully_addressable and x.nbytes <= HOST_LEAF_BYTES


def small_leaves_on_host(tree: PyTree) -> PyTree:
  """``tree`` with each small, fully addressable ``jax.Array`` leaf (<=
  ``HOST_LEAF_BYTES``) replaced by a numpy copy, in one process only.

  Why: orbax's per-array cost is higher for a ``jax.Array`` (its sharding
  metadata and replica slices) than for a numpy array, and a training state
  is mostly small leaves (scalars, biases, counters), so a save commits in
  about half the time (``benchmarks/README.md``, "Checkpoints"). The files are the same zarr arrays, restored
  onto any target sharding. Large leaves stay ``jax.Array`` leaves: orbax
  writes them per shard, chunked. The copies are taken before ``save``
  returns, so the next step may donate the buffers.
  """
  if jax.process_count() != 1:
    return tree
  leaves, treedef = jax.tree.flatten(tree)
  picked = [i for i, x in enumerate(leaves) if small_whole(x)]
  on_host = jax.device_get([leaves[i] for i in picked])   # one batch of transfers
  for i, x in zip(picked, on_host):
    leaves[i] = np.array(x, copy=True)   # owned: never a view of a donated buffer
  return jax.tree.unflatten(treedef, leaves)


# -- shardings to restore onto ------------------------------------------------


def _context_mesh():
  """The concrete mesh of an enclosing ``jax.set_mesh``, or None."""
  mesh = jax.sharding.get_mesh()
  return None if mesh is None or mesh.empty else mesh


def _concrete(sharding, path: str):
  """``sharding`` on real devices: a leaf from ``jax.eval_shape`` inside
  ``jax.set_mesh`` carries an abstract mesh, replaced by the context's mesh;
  no sharding means replicated on the context's mesh, or the first local
  device outside one."""
  mesh = _context_mesh()
  if sharding is None:
    if mesh is not None:
      return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  if isinstance(sharding, jax.sharding.NamedSharding) and isinstance(
      sharding.mesh, jax.sharding.AbstractMesh):
    if mesh is None or mesh.abstract_mesh != sharding.mesh:
      raise CheckpointError(
          f'{path}: expected a sharding on a concrete mesh, or an abstract one matching the '
          f'mesh set by jax.set_mesh, got {sharding} (context mesh: {mesh})')
    return jax.sharding.NamedSharding(mesh, sharding.spec)
  return sharding


def abstract_storable(abstract: PyTree) -> PyTree:
  """ShapeDtypeStructs of what is stored, each with a concrete sharding to restore onto."""

  def convert(path, x):
    sharding = _concrete(getattr(x, 'sharding', None), jax.tree_util.keystr(path))
    if is_typed_key(x):
      data = jax.eval_shape(jax.random.key_data, x)
      if isinstance(sharding, jax.sharding.NamedSharding):
        sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
      return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  return jax.tree_util.tree_map_with_path(convert, abstract)


def unstorable(stored: PyTree, abstract: PyTree) -> PyTree:
  return jax.tree.map(
      lambda s, a: jax.random.wrap_key_data(s, impl=key_impl(a)) if is_typed_key(a) else s,
      stored, abstract)


# -- fields added since a checkpoint was written ---------------------------------


def _data_fields(node) -> list[str] | None:
  """The pytree fields of a flax struct node (a dataclass with flax's public
  ``replace``: :class:`purax.TrainState`, a population), or None for any other
  node: another framework's dataclass (an Equinox module in the params) is
  restored as the structure it is, through no method of its own."""
  if (not dataclasses.is_dataclass(node) or isinstance(node, type)
      or not callable(getattr(node, 'replace', None))):
    return None
  return [f.name for f in dataclasses.fields(node) if f.metadata.get('pytree_node', True)]


def without_absent_fields(target: PyTree, saved) -> PyTree:
  """``target`` for a checkpoint written before some of its ``None`` fields
  existed (``spike_window`` of :class:`purax.TrainState`): each dataclass
  node with a ``None`` field that ``saved`` (the stored tree's metadata,
  nested mappings) lacks becomes a dict of its other fields, as orbax's
  structure check wants.
  :func:`with_absent_fields` undoes it after the restore. The leaves and
  their order are unchanged: a ``None`` field holds none."""
  fields = _data_fields(target)
  if fields is not None and isinstance(saved, Mapping):
    values = {f: getattr(target, f) for f in fields}
    absent = {f for f, v in values.items() if v is None and f not in saved}
    children = {f: without_absent_fields(v, saved.get(f)) for f, v in values.items()
                if f not in absent}
    return children if absent else target.replace(**children)
  if isinstance(target, Mapping) and isinstance(saved, Mapping):
    return type(target)((k, without_absent_fields(v, saved.get(k))) for k, v in target.items())
  return target


def with_absent_fields(restored: PyTree, target: PyTree) -> PyTree:
  """The inverse of :func:`without_absent_fields`: ``restored`` in ``target``'s
  structure (its absent fields ``None`` again)."""
  fields = _data_fields(target)
  if fields is not None and isinstance(restored, Mapping):
    return target.replace(**{f: with_absent_fields(restored[f], getattr(target, f))
                             for f in fields if f in restored})
  if fields is not None:
    return target.replace(**{f: with_absent_fields(getattr(restored, f), getattr(target, f))
                             for f in fields})
  if isinstance(target, Mapping) and isinstance(restored, Mapping):
    return type(target)((k, with_absent_fields(restored[k], v)) for k, v in target.items())
  return restored


# -- guard state kept in fields of its own before 0.3 ------------------------------


class TrainStateBefore030(struct.PyTreeNode):
  """How a :class:`purax.TrainState` was stored before 0.3: each guard's state
  a field of its own (``loss_scale``, ``spike_window``; ``None``: no leaves,
  and a checkpoint written before a field existed lacks it), where 0.3 keeps
  them in ``guards`` (:data:`purax.core.state.LEGACY_GUARD_FIELDS`). Its
  leaves, their paths and their order are those of the old state."""

  step: Any
  params: Any
  model_state: Any
  opt_state: Any
  rng: Any
  hparams: Any
  loss_scale: Any = None
  spike_window: Any = None


def in_saved_layout(target: PyTree, saved) -> PyTree:
  """``target`` in the layout of the stored tree ``saved`` (orbax's metadata:
  nested mappings; None: unknown, ``target`` as it is): each
  :class:`purax.TrainState` whose stored tree has no ``guards`` (written
  before 0.3) becomes a :class:`TrainStateBefore030`, so the signature, the
  fingerprints and the restore see the paths that were written.
  :func:`from_saved_layout` undoes it after the restore.

  Raises:
    CheckpointMismatchError: the target has guard state no field of the old
      layout held (a guard added since: the checkpoint cannot have it).
  """
  if isinstance(target, TrainState) and isinstance(saved, Mapping) and 'guards' not in saved:
    keys = {key: field for field, key in LEGACY_GUARD_FIELDS.items()}
    unknown = sorted(set(target.guards) - set(keys))
    if unknown:
      raise CheckpointMismatchError(
          f"state.guards: expected only {sorted(keys)} in a checkpoint written before 0.3 "
          f"(its guard state in fields of their own), got also {unknown}")
    return TrainStateBefore030(
        step=target.step, params=target.params, model_state=target.model_state,
        opt_state=target.opt_state, rng=target.rng, hparams=target.hparams,
        **{keys[k]: v for k, v in target.guards.items()})
  fields = _data_fields(target)
  if fields is not None and isinstance(saved, Mapping):
    return target.replace(**{f: in_saved_layout(getattr(target, f), saved.get(f))
                             for f in fields})
  if isinstance(target, Mapping) and isinstance(saved, Mapping):
    return type(target)((k, in_saved_layout(v, saved.get(k))) for k, v in target.items())
  return target


def from_saved_layout(restored: PyTree, target: PyTree) -> PyTree:
  """The inverse of :func:`in_saved_layout`: ``restored`` in ``target``'s layout."""
  if isinstance(restored, TrainStateBefore030) and isinstance(target, TrainState):
    guards = {key: getattr(restored, field) for field, key in LEGACY_GUARD_FIELDS.items()
              if getattr(restored, field) is not None}
    return target.replace(step=restored.step, params=restored.params,
                          model_state=restored.model_state, opt_state=restored.opt_state,
                          rng=restored.rng, hparams=restored.hparams, guards=guards)
  fields = _data_fields(target)
  if fields is not None and _data_fields(restored) is not None:
    return target.replace(**{f: from_saved_layout(getattr(restored, f), getattr(target, f))
                             for f in fields})
  if isinstance(target, Mapping) and isinstance(restored, Mapping):
    return type(target)((k, from_saved_layout(restored[k], v)) for k, v in target.items())
  return restored


# -- hyperparameters renamed since a checkpoint was written -----------------------


def as_saved(abstract: PyTree, saved_signature) -> tuple[PyTree, Any]:
  """``abstract`` with today's hyperparameter names spelled as a checkpoint
  written before they were renamed spells them
  (:data:`purax.core.hparams.RENAMED`: ``opt_state.hyperparams['peak_learning_rate']``
  of purax before 0.3 is ``['learning_rate']`` today), and the function that
  renames the restored tree back. Only the names the checkpoint's signature
  (:func:`signature`, a list of ``[path, shape, dtype]``) holds and today's
  target lacks are renamed: an up-to-date checkpoint restores as it is."""
  saved = {row[0] for row in saved_signature or ()}
  target = {row[0] for row in signature(abstract)}
  old = {new: name for name, new in hparams_lib.RENAMED.items()
         if any(p.endswith(f"hyperparams['{name}']") for p in saved - target)
         and any(p.endswith(f"hyperparams['{new}']") for p in target - saved)}
  if not old:
    return abstract, lambda tree: tree
  back = {name: new for new, name in old.items()}
  return hparams_lib.renamed(abstract, old), lambda tree: hparams_lib.renamed(tree, back)


# -- signatures -----------------------------------------------------------------


def signature(tree: PyTree) -> list[list]:
  """``[[path, shape, dtype], ...]`` of every stored leaf, in flattening order."""
  leaves = jax.tree_util.tree_flatten_with_path(storable_abstract(tree))[0]
  return [[jax.tree_util.keystr(path), list(x.shape), str(x.dtype)] for path, x in leaves]


def storable_abstract(tree: PyTree) -> PyTree:
  def convert(x):
    if is_typed_key(x):
      return jax.eval_shape(jax.random.key_data, x)
    return jax.ShapeDtypeStruct(jnp.shape(x), x.dtype)
  return jax.tree.map(convert, tree)


def check_signature(saved: list[list], target: list[list], where: str, *,
                    holder: str = 'the checkpoint',
                    why: str = 'the model or optimizer changed since it was saved',
                    cls: type = CheckpointMismatchError) -> None:
  """Raises ``cls`` naming the first path that differs between the signatures
  (:func:`signature`) of what ``holder`` holds (``saved``) and of the target."""
  saved_paths = {p for p, _, _ in saved}
  target_paths = {p for p, _, _ in target}
  for path, shape, dtype in target:
    if path not in saved_paths:
      raise cls(f'{where}: {path}: expected in {holder} ({why}), got no such entry')
  for path, _, _ in saved:
    if path not in target_paths:
      raise cls(f'{where}: {path}: expected no such entry ({why}), got one in {holder}')
  by_path = {p: (s, d) for p, s, d in saved}
  for path, shape, dtype in target:
    saved_shape, saved_dtype = by_path[path]
    if list(saved_shape) != list(shape) or saved_dtype != dtype:
      raise cls(
          f'{where}: {path}: expected {dtype}{list(shape)} (the current model), '
          f'got {saved_dtype}{list(saved_shape)} in {holder} (never cast)')




def check_savable(step, tree: PyTree, metrics, extra) -> None:
  """:meth:`Checkpointer.save`'s argument checks, before anything is written:
  an integer step, array leaves, a mapping of numbers and a mapping.

  Raises:
    CheckpointError: naming the argument (and the leaf or metric).
  """
  if not (isinstance(step, numbers.Integral) and not isinstance(step, bool)) and not (
      isinstance(step, (np.ndarray, np.generic, jax.Array)) and np.shape(step) == ()
      and jnp.issubdtype(step.dtype, jnp.integer)):
    raise CheckpointError(f'step: expected an integer, got {type(step).__name__} '
                          f'{reprlib.repr(step)}')
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  if not leaves:
    raise CheckpointError(f'tree: expected a pytree of arrays, got one with no leaves '
                          f'({reprlib.repr(tree)})')
  for path, x in leaves:
    if not isinstance(x, (np.ndarray, np.generic, jax.Array)) or (
        not is_typed_key(x) and x.dtype.kind in 'OSU'):
      raise CheckpointError(f'tree{jax.tree_util.keystr(path)}: expected an array, got '
                            f'{type(x).__name__} {reprlib.repr(x)}')
  for name, value in (('metrics', metrics), ('extra', extra)):
    if value is not None and not isinstance(value, Mapping):
      raise CheckpointError(f'{name}: expected None or a mapping, got {type(value).__name__} '
                            f'{reprlib.repr(value)}')
  for key, value in (metrics or {}).items():
    if not isinstance(value, (numbers.Real, np.ndarray, np.generic, jax.Array)) or np.size(
        value) != 1:
      raise CheckpointError(f'metrics[{key!r}]: expected a number, got '
                            f'{type(value).__name__} {reprlib.repr(value)}')
