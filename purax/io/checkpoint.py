"""Checkpoints on orbax's ``CheckpointManager``: async, strict, crash-safe.

A checkpoint at step ``s`` holds, under one step directory committed
atomically by orbax:

- ``state``: any pytree of arrays (purax saves ``{'state': TrainState,
  'train_metrics': ...}``); typed PRNG keys are stored as their key data and
  re-wrapped on restore;
- ``extra``: JSON — the data position (``{'next_step': s}``; purax's batches
  are random access by step), the signature of every saved leaf (path, shape,
  dtype), and whatever metadata the caller gives (config, versions, mesh).

Saves are asynchronous: ``save`` returns once the arrays are copied off the
device (orbax's synchronous phase), so a following step may donate them; the
files are written in the background. Failures surface as
:class:`CheckpointError` at the next ``save`` or at ``wait``, and never touch
earlier checkpoints. Restore is strict — a different structure, shape or dtype
is a :class:`CheckpointMismatchError` naming the first differing path — and
skips, with a warning, a newest checkpoint that cannot be read (truncated or
half-written files).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from purax.core.errors import PuraxError

PyTree = Any


class CheckpointError(PuraxError):
  """A checkpoint could not be written or read."""


class CheckpointMismatchError(CheckpointError):
  """The checkpoint's structure, shapes or dtypes differ from the target's."""


# -- typed keys <-> key data ------------------------------------------------


def _is_typed_key(x) -> bool:
  return hasattr(x, 'dtype') and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _key_impl(x):
  # Works for concrete keys and for jax.ShapeDtypeStruct targets alike.
  return x.dtype._impl  # pylint: disable=protected-access


def _storable(tree: PyTree) -> PyTree:
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_typed_key(x) else x, tree)


def _default_sharding():
  return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _abstract_storable(abstract: PyTree) -> PyTree:
  """ShapeDtypeStructs of what is stored, each with a sharding to restore onto."""

  def convert(x):
    sharding = getattr(x, 'sharding', None) or _default_sharding()
    if _is_typed_key(x):
      data = jax.eval_shape(jax.random.key_data, x)
      if isinstance(sharding, jax.sharding.NamedSharding):
        sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
      return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  return jax.tree.map(convert, abstract)


def _unstorable(stored: PyTree, abstract: PyTree) -> PyTree:
  return jax.tree.map(
      lambda s, a: jax.random.wrap_key_data(s, impl=_key_impl(a)) if _is_typed_key(a) else s,
      stored, abstract)


def signature(tree: PyTree) -> list[list]:
  """``[[path, shape, dtype], ...]`` of every stored leaf, in flattening order."""
  leaves = jax.tree_util.tree_flatten_with_path(_storable_abstract(tree))[0]
  return [[jax.tree_util.keystr(path), list(x.shape), str(x.dtype)] for path, x in leaves]


def _storable_abstract(tree: PyTree) -> PyTree:
  def convert(x):
    if _is_typed_key(x):
      return jax.eval_shape(jax.random.key_data, x)
    return jax.ShapeDtypeStruct(jnp.shape(x), x.dtype)
  return jax.tree.map(convert, tree)


def check_signature(saved: list[list], target: list[list], where: str) -> None:
  """Raises CheckpointMismatchError naming the first path that differs."""
  saved_paths = {p for p, _, _ in saved}
  target_paths = {p for p, _, _ in target}
  for path, shape, dtype in target:
    if path not in saved_paths:
      raise CheckpointMismatchError(
          f'{where}: {path}: expected in the checkpoint (the model or optimizer changed '
          f'since it was saved), got no such entry')
  for path, _, _ in saved:
    if path not in target_paths:
      raise CheckpointMismatchError(
          f'{where}: {path}: expected no such entry (the model or optimizer changed '
          f'since the checkpoint was saved), got one in the checkpoint')
  by_path = {p: (s, d) for p, s, d in saved}
  for path, shape, dtype in target:
    saved_shape, saved_dtype = by_path[path]
    if list(saved_shape) != list(shape) or saved_dtype != dtype:
      raise CheckpointMismatchError(
          f'{where}: {path}: expected {dtype}{list(shape)} (the current model), '
          f'got {saved_dtype}{list(saved_shape)} in the checkpoint')


class Checkpointer:
  """Saves and restores purax runs with an orbax ``CheckpointManager``.

  Args:
    directory: where step directories go (created if missing).
    keep_last: keep the newest N checkpoints.
    keep_best: also keep the best K by ``best_metric`` (0: off). Only saves
      given ``metrics`` containing ``best_metric`` compete.
    best_metric: the metric name, e.g. ``'eval/accuracy'``.
    best_mode: ``'max'`` or ``'min'``.
    metadata: JSON-serialisable data saved with every checkpoint (config,
      versions, mesh).
    async_save: write in a background thread (orbax's async checkpointing).
  """

  def __init__(self, directory: str, *, keep_last: int = 3, keep_best: int = 0,
               best_metric: str = 'eval/accuracy', best_mode: str = 'max',
               metadata: Mapping[str, Any] | None = None, async_save: bool = True):
    if keep_last < 1:
      raise CheckpointError(f'keep_last: expected >= 1, got {keep_last}')
    if best_mode not in ('max', 'min'):
      raise CheckpointError(f"best_mode: expected 'max' or 'min', got {best_mode!r}")
    self.directory = os.path.abspath(directory)
    self.metadata = dict(metadata or {})
    preserve = [policies.LatestN(n=keep_last)]
    if keep_best:
      preserve.append(policies.BestN(
          get_metric_fn=lambda m: m[best_metric], reverse=(best_mode == 'min'),
          n=keep_best, keep_checkpoints_without_metrics=False))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=policies.AnyPreservationPolicy(preserve), create=True,
        enable_async_checkpointing=async_save, cleanup_tmp_directories=True)
    try:
      self._manager = ocp.CheckpointManager(self.directory, options=options,
                                            item_names=('state', 'extra'))
    except OSError as e:
      raise CheckpointError(f'checkpoint directory {self.directory}: expected writable, '
                            f'got {type(e).__name__}: {e}') from e

  # -- saving --

  def save(self, step: int, tree: PyTree, *, metrics: Mapping[str, float] | None = None,
           extra: Mapping[str, Any] | None = None) -> None:
    """Starts saving ``tree`` as checkpoint ``step`` (asynchronous).

    Raises:
      CheckpointError: this save, or an earlier asynchronous one, failed (no
        space, no permission, ...); earlier committed checkpoints are intact.
    """
    step = int(step)
    payload = {'data': {'next_step': step}, 'signature': signature(tree),
               **self.metadata, **(extra or {})}
    with self._failures(f'saving checkpoint {step}'):  # earlier background failures too
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(_storable(tree)), extra=ocp.args.JsonSave(payload)),
          metrics=dict(metrics) if metrics else None, force=True)

  def wait(self) -> None:
    """Blocks until every started save is committed.

    Raises:
      CheckpointError: a background save failed.
    """
    with self._failures('checkpoint save'):
      self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for started saves and releases orbax's threads.

    Raises:
      CheckpointError: a background save failed.
    """
    try:
      self.wait()
    finally:
      with self._failures('closing checkpoints'):  # e.g. a failed save's last metadata write
        self._manager.close()

  @contextlib.contextmanager
  def _failures(self, what: str):
    """Re-raises orbax's errors as CheckpointError naming what failed and where."""
    try:
      yield
    except Exception as e:
      raise CheckpointError(f'{what} in {self.directory} failed: '
                            f'{type(e).__name__}: {e}') from e

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # -- restoring --

  def steps(self) -> list[int]:
    """Committed checkpoint steps, oldest first."""
    self._manager.reload()
    return sorted(self._manager.all_steps())

  def restore(self, abstract: PyTree, step: int | None = None
              ) -> tuple[PyTree, dict[str, Any], int]:
    """Restores ``abstract``'s structure from checkpoint ``step`` or the newest readable.

    Args:
      abstract: a pytree of ``jax.ShapeDtypeStruct`` (e.g. from
        ``jax.eval_shape``), optionally with ``.sharding`` on each leaf: the
        arrays are placed on those shardings, so a checkpoint written on one
        mesh or device count restores onto another. Leaves without a sharding
        go to the first local device.
      step: a specific step; default: the newest, falling back to older ones
        (with a warning) when the newest cannot be read.

    Returns:
      ``(tree, extra, step)``: the restored arrays (copied by a jitted
      placement, so a first step may donate them), the JSON extra, the step.

    Raises:
      CheckpointMismatchError: structure, shape or dtype differ (never cast
        or zero-filled); CheckpointError: no readable checkpoint.
    """
    steps = [step] if step is not None else list(reversed(self.steps()))
    if not steps:
      raise CheckpointError(f'checkpoint directory {self.directory}: expected a committed '
                            'checkpoint, got none')
    errors = []
    for s in steps:
      try:
        return self._restore_step(abstract, s)
      except CheckpointMismatchError:
        raise
      except Exception as e:  # truncated or half-written files
        if step is not None:
          raise CheckpointError(f'checkpoint {s} in {self.directory} is unreadable: '
                                f'{type(e).__name__}: {e}') from e
        warnings.warn(f'purax: skipping unreadable checkpoint {s} in {self.directory} '
                      f'({type(e).__name__}: {str(e)[:200]}); trying an older one',
                      RuntimeWarning, stacklevel=2)
        errors.append(f'{s}: {type(e).__name__}')
    raise CheckpointError(f'checkpoint directory {self.directory}: expected a readable '
                          f'checkpoint, got none ({", ".join(errors)})')

  def _restore_step(self, abstract, step):
    extra = self._manager.restore(step, args=ocp.args.Composite(
        extra=ocp.args.JsonRestore()))['extra']
    if 'signature' in extra:
      check_signature(extra['signature'], signature(abstract),
                      f'checkpoint {step} in {self.directory}')
    target = _abstract_storable(abstract)
    stored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target)))['state']
    # A jitted copy keeps each array's sharding and gives buffers that the
    # first train step may donate.
    shardings = jax.tree.map(lambda x: x.sharding, stored)
    placed = jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=shardings)(stored)
    return _unstorable(placed, abstract), extra, step
