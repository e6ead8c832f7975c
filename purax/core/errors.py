"""Named error classes for the failure modes users hit most.

Every message names the field, the expected value and the actual value, e.g.
``batch['y']: expected an integer dtype, got float32``. All derive from
``ValueError`` so ``except ValueError`` keeps working.
"""

from __future__ import annotations


class PuraxError(ValueError):
  """Base class of purax's errors."""


class ConfigError(PuraxError):
  """A configuration value is out of range or unknown (raised before compiling)."""


class DataError(PuraxError):
  """A data set or batch has the wrong structure, shape, dtype or values."""


class ContractError(PuraxError):
  """A user function (loss, model) returned something outside its documented
  contract; the message names the function, the part and what was expected."""


class NonFiniteError(PuraxError):
  """Training produced non-finite gradients for too many consecutive steps."""


def expect(condition: bool, field: str, expected: str, actual, cls=DataError) -> None:
  """Raises ``cls(f"{field}: expected {expected}, got {actual}")`` unless ``condition``."""
  if not condition:
    raise cls(f'{field}: expected {expected}, got {actual}')
