"""What a config field means for a run beyond its value: field metadata read
by :mod:`purax.app.config` (one place per field, next to its default)."""

from __future__ import annotations

import dataclasses
from typing import Any

#: Metadata keys: the field may differ when a run is resumed (it does not
#: change the computation); the field is a step cadence (a multiple of an
#: integer ``--steps-per-call``).
RESUMABLE, CADENCE = 'resumable', 'cadence'


def field(default: Any, *, resumable: bool = False, cadence: bool = False) -> Any:
  """A dataclass field with ``default`` and the run's metadata."""
  return dataclasses.field(default=default, metadata={RESUMABLE: resumable, CADENCE: cadence})


def names(cls, key: str) -> tuple[str, ...]:
  """The names of ``cls``'s fields whose metadata has ``key``."""
  return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get(key))
