"""The :class:`Checkpointer`: saves and restores pytrees with an orbax ``CheckpointManager``."""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as orbax_policies

from purax.core.errors import CheckpointError, ConfigError, expect_kind
from purax.core.metrics import MODES, Best, to_minimise
from purax.io.checkpoint import integrity, layout, quiet
from purax.io.checkpoint.integrity import Unreadable
from purax.io.checkpoint.policies import DEFAULT_INTERVAL_S, BestOfRecorded, IntervalSinceStart

PyTree = Any

quiet.install()   # a failed read or write leaves no task behind in a closed event loop
_TENSORSTORE_SPEC = re.compile(r" ?\[tensorstore_spec='.*?'\]", re.DOTALL)


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
      given ``metrics`` containing ``best_metric`` compete; the metrics are
      stored in the checkpoint, so a later ``Checkpointer`` on the same
      directory (a resumed run) keeps the same ones.
    best_metric: any logged metric name, e.g. ``'eval/accuracy'``,
      ``'eval/loss'``, ``'train/loss'`` (:class:`purax.hooks.Checkpoint`
      saves with every number written at its step); ranked by
      :class:`purax.core.metrics.Best`, the rule early stopping uses too.
    best_mode: ``'max'`` or ``'min'``.
    metadata: JSON-serialisable data saved with every checkpoint (config,
      versions, mesh).
    async_save: write in a background thread (orbax's async checkpointing).
    verify: on restore, require each checkpoint's integrity records (the
      SHA-256 of its JSON, the per-array fingerprints and signature) and
      check them; a checkpoint missing one is unreadable, not unchecked.
      ``False`` waives the checks (a checkpoint written by other tools).
    read_only: open the directory to read it (``purax eval``, ``export``,
      :func:`purax.restore_or_init` given a path): nothing in it is created,
      renamed, deleted or cleaned up, so a trainer writing the same
      directory is not disturbed (its unfinished saves are its own to clean,
      under its run's lock); :meth:`save` is refused.
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
               interval_s: float | None = DEFAULT_INTERVAL_S, verify: bool = True,
               read_only: bool = False):
    expect_kind(directory, 'directory', (str, os.PathLike), 'a path', CheckpointError)
    for name, value in (('keep_last', keep_last), ('keep_best', keep_best)):
      expect_kind(value, name, (int, np.integer), 'an integer', CheckpointError)
    for name, value in (('async_save', async_save), ('verify', verify),
                        ('read_only', read_only)):
      expect_kind(value, name, bool, 'True or False', CheckpointError)
    expect_kind(best_metric, 'best_metric', str, "a metric name, e.g. 'eval/accuracy'",
                CheckpointError)
    expect_kind(best_mode, 'best_mode', str, "'max' or 'min'", CheckpointError)
    expect_kind(metadata, 'metadata', (Mapping, type(None)), 'a mapping or None',
                CheckpointError)
    expect_kind(interval_s, 'interval_s', (int, float, type(None)), 'None or seconds >= 0',
                CheckpointError)
    if keep_last < 1:
      raise CheckpointError(f'keep_last: expected >= 1, got {keep_last}')
    if best_mode not in MODES:
      raise CheckpointError(f"best_mode: expected 'max' or 'min', got {best_mode!r}")
    if interval_s is not None and not (isinstance(interval_s, (int, float)) and interval_s >= 0
                                       and np.isfinite(interval_s)):
      raise CheckpointError(f'interval_s: expected None or seconds >= 0, got {interval_s!r}')
    self.interval_s = float(interval_s) if interval_s else None
    self.directory = os.path.abspath(directory)
    self.metadata = dict(metadata or {})
    self.verify = bool(verify)
    try:   # the metric's name is looked up as given; Best is the direction's rule
      self.best = Best(best_metric, best_mode)
    except ConfigError as e:
      raise CheckpointError(str(e)) from None
    self.best_metric = best_metric
    self.keep_best, self.read_only = int(keep_best), bool(read_only)
    self._scores: dict[int, float] = {}
    self._writing: int | None = None   # the step of the save started last, until waited for
    preserve = [orbax_policies.LatestN(n=keep_last)]
    if keep_best:
      preserve.append(BestOfRecorded(keep_best, self._scores, self.best))
    quiet.divert_errors()   # orbax's error logs off stderr: this object raises the errors
    if read_only:   # a reader: nothing created, cleaned up, renamed or deleted
      options = ocp.CheckpointManagerOptions(read_only=True, create=False,
                                             cleanup_tmp_directories=False,
                                             save_root_metadata=False, save_interval_steps=0)
    else:
      options = ocp.CheckpointManagerOptions(
          preservation_policy=orbax_policies.AnyPreservationPolicy(preserve), create=True,
          save_decision_policy=IntervalSinceStart(self.interval_s) if self.interval_s else None,
          enable_async_checkpointing=async_save, cleanup_tmp_directories=True)
    if read_only and not os.path.isdir(self.directory):
      raise CheckpointError(f'checkpoint directory {self.directory}: expected a directory to '
                            'read, got none')
    try:
      self._manager = ocp.CheckpointManager(self.directory, options=options,
                                            item_names=('state', 'extra'))
    except OSError as e:
      raise CheckpointError(f'checkpoint directory {self.directory}: expected '
                            f'{"readable" if read_only else "writable"}, got '
                            f'{type(e).__name__}: {e}') from e
    if keep_best:
      self._read_scores()

  def _read_scores(self) -> None:
    """The best metric of every committed checkpoint, read from its JSON."""
    for s in self._manager.all_steps():
      with contextlib.suppress(Unreadable):   # an unreadable one does not compete
        score = self._read_extra(s).get('metrics', {}).get(self.best_metric)
        if isinstance(score, (int, float)):
          self._scores[s] = float(score)

  def would_keep(self, metrics: Mapping[str, Any]) -> bool:
    """Whether a save with these ``metrics`` would be among the ``keep_best``
    best (by ``best_metric``): the metric is there, finite, and better than
    the worst of the best kept so far (or fewer are kept). False without
    ``keep_best``. :class:`purax.hooks.Checkpoint` saves at every such step,
    so the best evaluations are always among the kept checkpoints."""
    if not self.keep_best or self.best_metric not in metrics:
      return False
    try:
      score = float(metrics[self.best_metric])
    except (TypeError, ValueError):
      return False
    if not np.isfinite(score):
      return False
    ranked = sorted(float(to_minimise(v, self.best.mode)) for v in self._scores.values()
                    if np.isfinite(v))
    return (len(ranked) < self.keep_best
            or float(to_minimise(score, self.best.mode)) < ranked[self.keep_best - 1])

  def best_step(self) -> int:
    """The committed checkpoint with the best ``best_metric`` (ties: the older).

    Raises:
      CheckpointError: no committed checkpoint records ``best_metric``.
    """
    steps = set(self.steps())
    if not self._scores:
      self._read_scores()
    scored = sorted((float(to_minimise(v, self.best.mode)), s) for s, v in self._scores.items()
                    if s in steps and np.isfinite(v))
    if not scored:
      raise CheckpointError(f'checkpoint directory {self.directory}: expected a checkpoint '
                            f'that records {self.best_metric!r} (saved at an evaluation), got '
                            f'none among steps {sorted(steps)}')
    return scored[0][1]

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
    if self.read_only:
      raise CheckpointError(f'checkpoint directory {self.directory}: opened read-only (a '
                            f'reader), expected no save, got one of step {step}')
    layout.check_savable(step, tree, metrics, extra)
    step = int(step)
    metrics = {k: float(v) for k, v in (metrics or {}).items()}
    stored = layout.small_leaves_on_host(layout.storable(tree))
    payload = {'data': {'next_step': step}, 'signature': layout.signature(tree),
               'fingerprints': integrity.fingerprints(stored),
               'metrics': {k: v if np.isfinite(v) else str(v) for k, v in metrics.items()},
               **self.metadata, **(extra or {})}
    payload['sha256'] = integrity.json_digest(payload)
    self.wait()   # an earlier background save's failure, named by that save's step
    if self.best_metric in metrics:
      self._scores[step] = metrics[self.best_metric]
    self._writing = step
    with self._failures(f'saving checkpoint {step}'):
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(stored), extra=ocp.args.JsonSave(payload)),
          metrics=metrics or None, force=True)

  def drop_after(self, step: int) -> list[int]:
    """Deletes the committed checkpoints of steps after ``step`` (a run that
    went back to ``step``: :class:`purax.hooks.SpikeRollback`), after the
    started saves commit; returns their steps.

    Raises:
      CheckpointError: a save or the deletion failed.
    """
    self.wait()
    dropped = [s for s in self.steps() if s > int(step)]
    with self._failures(f'deleting checkpoints {dropped}'):
      for s in dropped:
        self._manager.delete(s)
        self._scores.pop(s, None)
    return dropped

  def wait(self) -> None:
    """Blocks until every started save is committed.

    Raises:
      CheckpointError: a background save failed, naming its step.
    """
    step, self._writing = self._writing, None
    with self._failures('checkpoint save' if step is None else f'saving checkpoint {step}'):
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
      cause = _TENSORSTORE_SPEC.sub('', str(e))   # the cause, without the store's spec
      raise CheckpointError(f'{what} in {self.directory} failed: '
                            f'{type(e).__name__}: {cause}') from e

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
      except Unreadable as e:
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
      except Unreadable as e:
        if step is not None:
          raise CheckpointError(f'checkpoint {s} in {self.directory} is unreadable: {e}'
                                ) from e
    raise CheckpointError(f'checkpoint directory {self.directory}: expected a checkpoint '
                          'with an intact JSON, got none')

  def _move_aside(self, step: int) -> str | None:
    """Renames an unreadable step directory out of orbax's step names."""
    if jax.process_index() != 0 or self.read_only:
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
    """The step's JSON, checked against its own SHA-256 (required with ``verify``)
    and against the step directory's name (:func:`integrity.check_step`)."""
    try:
      extra = self._manager.restore(step, args=ocp.args.Composite(
          extra=ocp.args.JsonRestore()))['extra']
    except Exception as e:   # any failure to read or parse the file: the files' fault
      raise Unreadable(f'extra JSON: {type(e).__name__}: {e}') from e
    if not isinstance(extra, dict):
      raise Unreadable(f'extra JSON: expected an object, got {type(extra).__name__}')
    if self.verify:
      integrity.require_records(extra)
      if extra['sha256'] != integrity.json_digest(extra):
        raise Unreadable('extra JSON: SHA-256 mismatch: the bytes changed on disk')
    integrity.check_step(extra, step)
    return extra

  def _read_on_host(self, step: int, target: PyTree) -> PyTree:
    """The stored arrays as numpy, without placing them anywhere."""
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
    item = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), target)
    with ocp.PyTreeCheckpointer() as reader:
      return reader.restore(os.path.join(self.directory, str(step), 'state'),
                            args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args))

  def _saved_tree(self, step: int):
    """The stored tree's structure (orbax's metadata: nested mappings), or None
    when it cannot be read (the restore then says why)."""
    try:
      return ocp.StandardCheckpointHandler().metadata(
          epath.Path(self.directory) / str(step) / 'state').tree
    except Exception:   # any failure to read it: the restore reports the files' state
      return None

  def _restore_step(self, wanted, step):
    where = f'checkpoint {step} in {self.directory}'
    extra = self._read_extra(step)
    saved = self._saved_tree(step)
    # A checkpoint written before 0.3 keeps guard state in fields of its own,
    # and stores a hyperparameter under its old name.
    guarded = layout.in_saved_layout(wanted, saved)
    abstract, today = layout.as_saved(guarded, extra.get('signature'))
    target_signature = layout.signature(abstract)
    if self.verify:
      layout.check_signature(extra['signature'], target_signature, where)
    full = layout.abstract_storable(abstract)
    # A checkpoint written before a None field of the state existed lacks it.
    target = layout.without_absent_fields(full, saved)
    try:
      stored = layout.with_absent_fields(self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target)))['state'], full)
    except Exception as e:   # the files' fault or the target's? Read them bare to tell.
      if integrity.is_io_error(e):
        raise Unreadable(f'{type(e).__name__}: {e}') from e
      try:
        on_host = layout.with_absent_fields(self._read_on_host(step, target), full)
      except Exception as bare:   # unreadable even without a target: the files' fault
        raise Unreadable(f'{type(bare).__name__}: {bare}') from e
      if self.verify:
        integrity.check_fingerprints(extra['fingerprints'], on_host, target_signature)
      raise CheckpointError(f'{where}: the files are intact, but restoring onto the target '
                            f'failed: {type(e).__name__}: {e}') from e
    # A jitted copy keeps each array's sharding and gives buffers that the
    # first train step may donate.
    shardings = jax.tree.map(lambda x: x.sharding, stored)
    placed = jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=shardings)(stored)
    if self.verify:
      integrity.check_fingerprints(extra['fingerprints'], placed, target_signature)
    restored = today(layout.unstorable(placed, abstract))
    if jax.tree.structure(guarded) != jax.tree.structure(wanted):
      restored = layout.from_saved_layout(restored, wanted)
    return restored, extra, step
