"""Checkpoints on orbax's ``CheckpointManager``: async, strict, crash-safe.

The package: :mod:`~purax.io.checkpoint.manager` (:class:`Checkpointer`),
:mod:`~purax.io.checkpoint.layout` (what is stored, signatures, restore
shardings), :mod:`~purax.io.checkpoint.integrity` (fingerprints, the JSON's
SHA-256), :mod:`~purax.io.checkpoint.policies` (keep-best, the wall-clock
cadence) and :mod:`~purax.io.checkpoint.run` (a training run's checkpoint layout,
:class:`~purax.io.checkpoint.run.Restored` and :func:`~purax.io.checkpoint.run.restore_or_init`).

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
a cast (both classes live with purax's other named errors in
:mod:`purax.core.errors`).

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

from purax.core.errors import CheckpointError as CheckpointError
from purax.core.errors import CheckpointMismatchError as CheckpointMismatchError
from purax.io.checkpoint.integrity import fingerprints as fingerprints
from purax.io.checkpoint.layout import HOST_LEAF_BYTES as HOST_LEAF_BYTES
from purax.io.checkpoint.layout import check_signature as check_signature
from purax.io.checkpoint.layout import signature as signature
from purax.io.checkpoint.manager import Checkpointer as Checkpointer
from purax.io.checkpoint.policies import DEFAULT_INTERVAL_S as DEFAULT_INTERVAL_S

from purax.core import lazy as _lazy  # noqa: E402

# Moved in 0.3 (no two modules of one file name): the old import path still works.
_lazy.moved('purax.io.checkpoint.errors', 'purax.core.errors')

__all__ = [
    'CheckpointError',
    'CheckpointMismatchError',
    'Checkpointer',
    'DEFAULT_INTERVAL_S',
    'HOST_LEAF_BYTES',
    'check_signature',
    'fingerprints',
    'signature',
]
