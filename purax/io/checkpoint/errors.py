"""The errors of checkpointing."""

from __future__ import annotations

from purax.core.errors import PuraxError


class CheckpointError(PuraxError):
  """A checkpoint could not be written or read."""


class CheckpointMismatchError(CheckpointError):
  """The checkpoint's structure, shapes or dtypes differ from the target's."""


class Unreadable(Exception):
  """A checkpoint's files cannot be read or fail their checksums (internal:
  restore falls back to an older checkpoint)."""
