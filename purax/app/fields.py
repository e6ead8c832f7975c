"""What a config field means for a run beyond its value: field metadata read
by :mod:`purax.app.config` (one place per field, next to its default)."""

from __future__ import annotations

import dataclasses
from typing import Any

#: Metadata keys: the field may differ when a run is resumed; the field is a
#: step cadence (a multiple of an integer ``--steps-per-call``); the field
#: changes what the run computes (default: exactly the fields that may not
#: differ on resume; ``steps`` may, to train longer, and still changes it).
RESUMABLE, CADENCE, COMPUTATION = 'resumable', 'cadence', 'computation'


def field(default: Any, *, resumable: bool = False, cadence: bool = False,
          computation: bool | None = None) -> Any:
  """A dataclass field with ``default`` and the run's metadata.

  Args:
    default: the default value.
    resumable: may differ when a run is resumed.
    cadence: a step cadence.
    computation: changes what the run computes (the model, the data, the
      optimizer and its hyperparameters, the precision, the batch, the
      steps); default ``not resumable``. These fields, and only these, are a
      run's hyperparameters in TensorBoard's HParams tab.
  """
  return dataclasses.field(default=default, metadata={
      RESUMABLE: resumable, CADENCE: cadence,
      COMPUTATION: not resumable if computation is None else computation})


def changes_computation(item: dataclasses.Field) -> bool:
  """Whether a config field changes the computation (:func:`field`'s
  ``computation``; a field without metadata does: it must match on resume)."""
  return item.metadata.get(COMPUTATION, not item.metadata.get(RESUMABLE, False))


def names(cls, key: str) -> tuple[str, ...]:
  """The names of ``cls``'s fields whose metadata has ``key``."""
  return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get(key))
