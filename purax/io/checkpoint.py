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
is a :class:`CheckpointMismatchError` naming the first differing path, never
a cast.

Integrity: every save records a 64-bit fingerprint of each stored array
(independent of sharding: computed on the device, or by numpy for small
arrays) and a SHA-256 of the JSON
itself, inside the same atomic commit. Restore verifies both, so flipped,
zeroed, truncated or missing bytes are found. A checkpoint whose files cannot
be read or do not match is *unreadable*: restore warns, falls back to the next
older one, and (``move_aside=True``, what a resuming run does) renames it to
``STEP.unreadable-N`` so that it is kept for inspection and the step can be
saved again. Any other failure (a target sharding that cannot be placed, a
different model) is raised with its reason: an error is called unreadable only
when reading the same files onto the host without a target fails too.

Keep-best decisions survive restarts: the metrics a save competes with are
stored in its JSON and read back by every new ``Checkpointer``.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

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


class _Unreadable(Exception):
  """A checkpoint's files cannot be read or fail their checksums (internal)."""


# -- typed keys <-> key data ------------------------------------------------


def _is_typed_key(x) -> bool:
  return hasattr(x, 'dtype') and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _key_impl(x):
  # Works for concrete keys and for jax.ShapeDtypeStruct targets alike.
  return x.dtype._impl  # pylint: disable=protected-access


def _storable(tree: PyTree) -> PyTree:
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_typed_key(x) else x, tree)


# Leaves up to this size are handed to orbax as host numpy copies (one process
# only) and fingerprinted by numpy.
HOST_LEAF_BYTES = 1 << 20


def _small_whole(x) -> bool:
  """Whether ``x`` is a ``jax.Array`` this process holds whole, of at most
  ``HOST_LEAF_BYTES``: cheap to copy to the host and handle there."""
  return isinstance(x, jax.Array) and x.is_fully_addressable and x.nbytes <= HOST_LEAF_BYTES


def _small_leaves_on_host(tree: PyTree) -> PyTree:
  """``tree`` with each small, fully addressable ``jax.Array`` leaf (<=
  ``HOST_LEAF_BYTES``) replaced by a numpy copy, in one process only.

  Why: orbax's per-array cost for a ``jax.Array`` (its sharding metadata and
  replica slices) is ~1.4 ms on the CPU against ~0.5 ms for a numpy array, and
  a training state is mostly small leaves (scalars, biases, counters), so the
  save of the default job's 46 arrays commits in about half the time
  (``benchmarks/checkpoint.py``). The files are the same zarr arrays, restored
  onto any target sharding. Large leaves stay ``jax.Array`` leaves: orbax
  writes them per shard, chunked. The copies are taken before ``save``
  returns, so the next step may donate the buffers.
  """
  if jax.process_count() != 1:
    return tree
  leaves, treedef = jax.tree.flatten(tree)
  picked = [i for i, x in enumerate(leaves) if _small_whole(x)]
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


def _abstract_storable(abstract: PyTree) -> PyTree:
  """ShapeDtypeStructs of what is stored, each with a concrete sharding to restore onto."""

  def convert(path, x):
    sharding = _concrete(getattr(x, 'sharding', None), jax.tree_util.keystr(path))
    if _is_typed_key(x):
      data = jax.eval_shape(jax.random.key_data, x)
      if isinstance(sharding, jax.sharding.NamedSharding):
        sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
      return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  return jax.tree_util.tree_map_with_path(convert, abstract)


def _unstorable(stored: PyTree, abstract: PyTree) -> PyTree:
  return jax.tree.map(
      lambda s, a: jax.random.wrap_key_data(s, impl=_key_impl(a)) if _is_typed_key(a) else s,
      stored, abstract)


# -- checksums ------------------------------------------------------------------

_U32 = jnp.uint32


def _fmix32(h, u32=_U32):
  """MurmurHash3's 32-bit finaliser (every input bit affects every output bit);
  ``u32`` is ``jnp.uint32`` on the device, ``np.uint32`` on the host."""
  h = h ^ (h >> u32(16))
  h = h * u32(0x85EBCA6B)
  h = h ^ (h >> u32(13))
  h = h * u32(0xC2B2AE35)
  return h ^ (h >> u32(16))


def _words(x):
  """``x``'s bits as uint32 words (one per element; two for 8-byte dtypes), or None."""
  if x.dtype == jnp.bool_:
    return x.astype(_U32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}.get(x.dtype.itemsize)
  if unsigned is None or jnp.issubdtype(x.dtype, jnp.complexfloating):
    return None
  try:
    return jax.lax.bitcast_convert_type(x, unsigned).astype(_U32)
  except (TypeError, ValueError):   # a dtype XLA cannot bitcast (e.g. int4): not checked
    return None


def _leaf_fingerprint(x):
  """Two order-independent sums of a mix of (word, position): exact under any
  sharding (uint32 sums wrap, so the reduction order does not matter)."""
  w = _words(x)
  if w is None:
    return jnp.zeros((2,), _U32)
  index = jnp.zeros(w.shape, _U32)
  for d in range(w.ndim):
    stride = int(np.prod(w.shape[d + 1:], dtype=np.uint64)) % 2 ** 32
    index = index + jax.lax.broadcasted_iota(_U32, w.shape, d) * _U32(stride)
  a = _fmix32(w ^ _fmix32(index * _U32(0x9E3779B9) + _U32(1)))
  b = _fmix32(w + _fmix32(index ^ _U32(0x7F4A7C15)))
  return jnp.stack([jnp.sum(a, dtype=_U32), jnp.sum(b, dtype=_U32)])


@jax.jit
def _fingerprints_on_device(tree):
  return [_leaf_fingerprint(x) for x in jax.tree.leaves(tree)]


# Dtypes whose host fingerprint is computed by numpy, bit for bit the device's
# (not bool: for a byte other than 0 or 1, which numpy can be made to hold,
# numpy's and XLA's conversions differ).
_HOST_DTYPES = frozenset(np.dtype(d) for d in (
    np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32, np.float16, jnp.bfloat16,
    np.float32))


def _host_fingerprint(x: np.ndarray) -> np.ndarray:
  """``_leaf_fingerprint`` of a numpy array (a ``_HOST_DTYPES`` dtype) by numpy:
  the same words, flat row-major positions and wrapping uint32 arithmetic."""
  x = np.ascontiguousarray(x).reshape(-1)
  u32 = np.uint32
  w = x.view(f'u{x.dtype.itemsize}').astype(u32)
  index = np.arange(w.size, dtype=u32)
  a = _fmix32(w ^ _fmix32(index * u32(0x9E3779B9) + u32(1), u32), u32)
  b = _fmix32(w + _fmix32(index ^ u32(0x7F4A7C15), u32), u32)
  return np.array([np.sum(a, dtype=u32), np.sum(b, dtype=u32)], u32)


def _on_host(x) -> bool:
  """Whether ``x`` is a leaf fingerprinted on the host: a numpy array, or an
  array that one process holds whole, of a ``_HOST_DTYPES`` dtype and at most
  ``HOST_LEAF_BYTES`` (numpy's hash makes ~5 temporaries of the leaf's size
  and runs on one core: larger leaves go to the device program)."""
  if isinstance(x, (np.ndarray, np.generic)):
    return x.dtype in _HOST_DTYPES and x.nbytes <= HOST_LEAF_BYTES
  return _small_whole(x) and x.dtype in _HOST_DTYPES


def fingerprints(tree: PyTree) -> list[str]:
  """A 64-bit hex fingerprint of each leaf's bits (typed keys: their key data), in
  flattening order. Equal trees give equal fingerprints under any sharding.

  Leaves up to ``HOST_LEAF_BYTES`` of the common dtypes (``_HOST_DTYPES``)
  are hashed by numpy on the host, the rest by one jitted program: the same
  function either way, so a small state's save compiles nothing (the program
  took ~0.6 s to compile for the default job's state, once per process).
  """
  leaves = jax.tree.leaves(_storable(tree))
  host = [i for i, x in enumerate(leaves) if _on_host(x)]
  device = sorted(set(range(len(leaves))) - set(host))
  sums = [None] * len(leaves)
  for i, x in zip(host, jax.device_get([leaves[i] for i in host])):
    sums[i] = _host_fingerprint(np.asarray(x))
  if device:
    on_device = _fingerprints_on_device([leaves[i] for i in device])
    for i, s in zip(device, jax.device_get(on_device)):
      sums[i] = s
  return [f'{int(s[0]):08x}{int(s[1]):08x}' for s in sums]


# How tensorstore reports files it cannot read or decode (its ValueErrors carry
# an absl status name).
_IO_STATUS = ('DATA_LOSS', 'NOT_FOUND', 'FAILED_PRECONDITION', 'OUT_OF_RANGE', 'Error reading',
              'Error opening', 'corrupt', 'Corrupt')


def _is_io_error(e: BaseException) -> bool:
  """Whether ``e`` (or an exception it came from) is a file system or format error."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, (OSError, UnicodeError, json.JSONDecodeError, EOFError)):
      return True
    if isinstance(e, ValueError) and any(s in str(e) for s in _IO_STATUS):
      return True
    e = e.__cause__ or e.__context__
  return False


def _json_digest(payload: Mapping[str, Any]) -> str:
  body = {k: v for k, v in payload.items() if k != 'sha256'}
  return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


# -- signatures -----------------------------------------------------------------


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
          f'got {saved_dtype}{list(saved_shape)} in the checkpoint (never cast)')


def _check_fingerprints(saved: Sequence[str], tree: PyTree, sig: list[list]) -> None:
  got = fingerprints(tree)
  if len(got) != len(saved):
    raise _Unreadable(f'checksums: expected {len(saved)} arrays, got {len(got)}')
  for (path, _, _), want, have in zip(sig, saved, got):
    if want != have:
      raise _Unreadable(f'{path}: checksum mismatch (saved {want}, read {have}): '
                        'the bytes changed on disk')


# -- keep-best --------------------------------------------------------------------


class _BestOfRecorded:
  """orbax preservation policy: keep the ``n`` best steps by a metric recorded
  per step in ``scores`` (read back from each checkpoint's JSON, so a new
  ``Checkpointer`` decides as the one before it did). Steps without a score
  do not compete."""

  def __init__(self, n: int, scores: dict[int, float], mode: str):
    self.n, self.scores, self.mode = n, scores, mode

  def should_preserve(self, checkpoints, *, context):
    del context
    sign = -1.0 if self.mode == 'max' else 1.0
    scored = sorted((sign * self.scores[c.step], c.step) for c in checkpoints
                    if np.isfinite(self.scores.get(c.step, np.nan)))
    best = {step for _, step in scored[:self.n]}   # best first; ties: the older step
    return [c.step in best for c in checkpoints]


class _IntervalSinceStart:
  """orbax save-decision policy: at least ``seconds`` since the last save, the
  clock starting at this ``Checkpointer``'s creation.

  orbax's ``ContinuousCheckpointingPolicy(minimum_interval_secs=...)`` decides
  (no save while one is still being written; on several hosts process 0
  decides and the others follow it); it is given the later of the newest
  checkpoint and the creation time as the previous save, because on its own it
  saves at once in an empty directory and at the first check after every
  resume — a save that a short run pays for and does not need.
  """

  def __init__(self, seconds: float):
    self.inner = policies.ContinuousCheckpointingPolicy(minimum_interval_secs=seconds)
    self.started = _Info(step=-1, time=datetime.datetime.now(tz=datetime.timezone.utc))

  def should_save(self, step, previous_steps, *, context):
    last = previous_steps[-1] if previous_steps else None
    anchor = last if last is not None and last.time >= self.started.time else self.started
    return self.inner.should_save(step, [anchor], context=context)


class _Info:
  """A ``PolicyCheckpointInfo``: the step, time and metrics of a save."""

  def __init__(self, step: int, time: datetime.datetime, metrics=None):
    self.step, self.time, self.metrics = step, time, metrics


# The wall-clock cadence a Checkpointer saves at by default (see ``interval_s``).
DEFAULT_INTERVAL_S = 300.0


class Checkpointer:
  """Saves and restores purax runs with an orbax ``CheckpointManager``.

  When to save is the caller's (``fit``'s) decision, from two sources: an
  explicit cadence (:class:`purax.hooks.Checkpoint` ``every``), and this object's wall-clock
  cadence :meth:`should_save` (``interval_s``), which ``fit`` asks at its log
  points; either saves, and ``fit`` always saves at the end and when stopped.

  Args:
    directory: where step directories go (created if missing).
    keep_last: keep the newest N checkpoints.
    keep_best: also keep the best K by ``best_metric`` (0: off). Only saves
      given ``metrics`` containing ``best_metric`` compete; the metric is
      stored in the checkpoint, so a later ``Checkpointer`` on the same
      directory (a resumed run) keeps the same ones.
    best_metric: the metric name, e.g. ``'eval/accuracy'``.
    best_mode: ``'max'`` or ``'min'``.
    metadata: JSON-serialisable data saved with every checkpoint (config,
      versions, mesh).
    async_save: write in a background thread (orbax's async checkpointing).
    interval_s: :meth:`should_save` is true once this many seconds have passed
      since the last save (or since this object was made), unless a save is
      still being written (orbax's ``ContinuousCheckpointingPolicy``). None or
      0: never (only explicit saves). The default, 300 s, bounds the work a
      crash loses to about five minutes while a save's fixed cost (~0.04 s
      for the default job's small state on the CPU, mostly orbax's commit)
      stays far below 5% of the training time.

  Raises:
    CheckpointError: bad ``keep_last``/``best_mode``/``interval_s``, or an
      unwritable directory.
  """

  def __init__(self, directory: str, *, keep_last: int = 3, keep_best: int = 0,
               best_metric: str = 'eval/accuracy', best_mode: str = 'max',
               metadata: Mapping[str, Any] | None = None, async_save: bool = True,
               interval_s: float | None = DEFAULT_INTERVAL_S):
    if keep_last < 1:
      raise CheckpointError(f'keep_last: expected >= 1, got {keep_last}')
    if best_mode not in ('max', 'min'):
      raise CheckpointError(f"best_mode: expected 'max' or 'min', got {best_mode!r}")
    if interval_s is not None and not (isinstance(interval_s, (int, float)) and interval_s >= 0
                                       and np.isfinite(interval_s)):
      raise CheckpointError(f'interval_s: expected None or seconds >= 0, got {interval_s!r}')
    self.interval_s = float(interval_s) if interval_s else None
    self.directory = os.path.abspath(directory)
    self.metadata = dict(metadata or {})
    self.best_metric = best_metric
    self._scores: dict[int, float] = {}
    preserve = [policies.LatestN(n=keep_last)]
    if keep_best:
      preserve.append(_BestOfRecorded(keep_best, self._scores, best_mode))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=policies.AnyPreservationPolicy(preserve), create=True,
        save_decision_policy=_IntervalSinceStart(self.interval_s) if self.interval_s else None,
        enable_async_checkpointing=async_save, cleanup_tmp_directories=True)
    try:
      self._manager = ocp.CheckpointManager(self.directory, options=options,
                                            item_names=('state', 'extra'))
    except OSError as e:
      raise CheckpointError(f'checkpoint directory {self.directory}: expected writable, '
                            f'got {type(e).__name__}: {e}') from e
    if keep_best:
      for s in self._manager.all_steps():
        with contextlib.suppress(_Unreadable):   # an unreadable one does not compete
          score = self._read_extra(s).get('metrics', {}).get(best_metric)
          if isinstance(score, (int, float)):
            self._scores[s] = float(score)

  # -- saving --

  def should_save(self, step: int) -> bool:
    """Whether the wall-clock cadence calls for a save at ``step`` (``interval_s``).

    False when ``interval_s`` is off, when ``step`` is not past the newest
    checkpoint, or while an earlier save is still being written. A host-side
    check (a clock read; on several processes, process 0's answer is shared),
    cheap enough for every log point but not meant for every step.
    """
    if self.interval_s is None:
      return False
    return bool(self._manager.should_save(int(step)))

  def save(self, step: int, tree: PyTree, *, metrics: Mapping[str, float] | None = None,
           extra: Mapping[str, Any] | None = None) -> None:
    """Starts saving ``tree`` as checkpoint ``step`` (asynchronous).

    The JSON gets the data position, the signature and fingerprint of every
    leaf, ``metrics`` (non-finite values as strings), the metadata and
    ``extra``, and a SHA-256 of itself.

    Raises:
      CheckpointError: this save, or an earlier asynchronous one, failed (no
        space, no permission, ...); earlier committed checkpoints are intact.
    """
    step = int(step)
    metrics = {k: float(v) for k, v in (metrics or {}).items()}
    stored = _small_leaves_on_host(_storable(tree))
    payload = {'data': {'next_step': step}, 'signature': signature(tree),
               'fingerprints': fingerprints(stored),
               'metrics': {k: v if np.isfinite(v) else str(v) for k, v in metrics.items()},
               **self.metadata, **(extra or {})}
    payload['sha256'] = _json_digest(payload)
    if self.best_metric in metrics:
      self._scores[step] = metrics[self.best_metric]
    with self._failures(f'saving checkpoint {step}'):  # earlier background failures too
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(stored), extra=ocp.args.JsonSave(payload)),
          metrics=metrics or None, force=True)

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
    except Exception as e:   # any orbax/tensorstore failure: re-raised, named
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

  def restore(self, abstract: PyTree, step: int | None = None, *, move_aside: bool = False
              ) -> tuple[PyTree, dict[str, Any], int]:
    """Restores ``abstract``'s structure from checkpoint ``step`` or the newest readable.

    Args:
      abstract: a pytree of ``jax.ShapeDtypeStruct`` (e.g. from
        ``jax.eval_shape``), optionally with ``.sharding`` on each leaf: the
        arrays are placed on those shardings, so a checkpoint written on one
        mesh or device count restores onto another. An abstract mesh (inside
        ``jax.set_mesh``) means the context's mesh; a leaf without a sharding
        is replicated on the context's mesh, or put on the first local device.
      step: a specific step; default: the newest, falling back to older ones
        (with a warning) when the newest is unreadable.
      move_aside: rename each unreadable checkpoint met on the way to
        ``STEP.unreadable-N`` (process 0; kept for inspection, no longer a
        step), so that the run can save that step again.

    Returns:
      ``(tree, extra, step)``: the restored arrays (copied by a jitted
      placement, so a first step may donate them), the JSON extra, the step.

    Raises:
      CheckpointMismatchError: structure, shape or dtype differ (never cast
        or zero-filled); CheckpointError: no readable checkpoint, or an error
        that is not the files' (e.g. a sharding that cannot be placed), with
        its reason.
    """
    steps = [step] if step is not None else list(reversed(self.steps()))
    if not steps:
      raise CheckpointError(f'checkpoint directory {self.directory}: expected a committed '
                            'checkpoint, got none')
    errors = []
    for s in steps:
      try:
        return self._restore_step(abstract, s)
      except _Unreadable as e:
        if step is not None:
          raise CheckpointError(f'checkpoint {s} in {self.directory} is unreadable: '
                                f'{e}') from e
        where = self._move_aside(s) if move_aside else None
        kept = f'; moved to {where}' if where else ''
        reason = ' '.join(str(e).split())[:300]
        warnings.warn(f'purax: skipping unreadable checkpoint {s} in {self.directory} '
                      f'({reason}){kept}; trying an older one',
                      RuntimeWarning, stacklevel=2)
        errors.append(f'{s}: {reason[:100]}')
    raise CheckpointError(f'checkpoint directory {self.directory}: expected a readable '
                          f'checkpoint, got none ({"; ".join(errors)})')

  def read_extra(self, step: int | None = None) -> dict[str, Any]:
    """The JSON of checkpoint ``step`` (default: the newest whose JSON is intact).

    Raises:
      CheckpointError: no such checkpoint, or none with an intact JSON.
    """
    for s in ([step] if step is not None else list(reversed(self.steps()))):
      try:
        return self._read_extra(s)
      except _Unreadable as e:
        if step is not None:
          raise CheckpointError(f'checkpoint {s} in {self.directory} is unreadable: {e}'
                                ) from e
    raise CheckpointError(f'checkpoint directory {self.directory}: expected a checkpoint '
                          'with an intact JSON, got none')

  def _move_aside(self, step: int) -> str | None:
    """Renames an unreadable step directory out of orbax's step names."""
    if jax.process_index() != 0:
      return None
    source = os.path.join(self.directory, str(step))
    n = 1
    while os.path.exists(f'{source}.unreadable-{n}'):
      n += 1
    try:
      os.rename(source, f'{source}.unreadable-{n}')
    except OSError as e:
      raise CheckpointError(f'checkpoint {step} in {self.directory} is unreadable and '
                            f'could not be moved aside: {e}') from e
    self._scores.pop(step, None)
    self._manager.reload()
    return f'{source}.unreadable-{n}'

  def _read_extra(self, step: int) -> dict[str, Any]:
    """The step's JSON, checked against its own SHA-256 (when it has one)."""
    try:
      extra = self._manager.restore(step, args=ocp.args.Composite(
          extra=ocp.args.JsonRestore()))['extra']
    except Exception as e:   # any failure to read or parse the file: the files' fault
      raise _Unreadable(f'extra JSON: {type(e).__name__}: {e}') from e
    if not isinstance(extra, dict):
      raise _Unreadable(f'extra JSON: expected an object, got {type(extra).__name__}')
    if 'sha256' in extra and extra['sha256'] != _json_digest(extra):
      raise _Unreadable('extra JSON: SHA-256 mismatch: the bytes changed on disk')
    return extra

  def _read_on_host(self, step: int, target: PyTree) -> PyTree:
    """The stored arrays as numpy, without placing them anywhere."""
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
    item = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), target)
    with ocp.PyTreeCheckpointer() as reader:
      return reader.restore(os.path.join(self.directory, str(step), 'state'),
                            args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args))

  def _restore_step(self, abstract, step):
    where = f'checkpoint {step} in {self.directory}'
    extra = self._read_extra(step)
    target_signature = signature(abstract)
    if 'signature' in extra:
      check_signature(extra['signature'], target_signature, where)
    target = _abstract_storable(abstract)
    try:
      stored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target)))['state']
    except Exception as e:   # the files' fault or the target's? Read them bare to tell.
      if _is_io_error(e):
        raise _Unreadable(f'{type(e).__name__}: {e}') from e
      try:
        on_host = self._read_on_host(step, target)
      except Exception as bare:   # unreadable even without a target: the files' fault
        raise _Unreadable(f'{type(bare).__name__}: {bare}') from e
      if 'fingerprints' in extra:
        _check_fingerprints(extra['fingerprints'], on_host, target_signature)
      raise CheckpointError(f'{where}: the files are intact, but restoring onto the target '
                            f'failed: {type(e).__name__}: {e}') from e
    # A jitted copy keeps each array's sharding and gives buffers that the
    # first train step may donate.
    shardings = jax.tree.map(lambda x: x.sharding, stored)
    placed = jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=shardings)(stored)
    if 'fingerprints' in extra:
      _check_fingerprints(extra['fingerprints'], placed, target_signature)
    return _unstorable(placed, abstract), extra, step
