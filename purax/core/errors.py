"""Named error classes for the failure modes users hit most.

Every message names the field, the expected value and the actual value, e.g.
``batch['y']: expected an integer dtype, got float32``. All derive from
``ValueError`` so ``except ValueError`` keeps working.
"""

from __future__ import annotations

import reprlib


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


class NonFiniteWarning(RuntimeWarning):
  """An update was skipped as non-finite: where its NaN came from
  (:class:`purax.hooks.NonFiniteReplay`), or why it could not be replayed."""


class Float8UpcastWarning(UserWarning):
  """Float8 matmuls were asked for on a device whose XLA backend upcasts
  them (no float8 GEMMs: anything but an NVIDIA GPU of compute capability
  8.9+): the step trains with float8 rounding and no float8 speed."""


class OutOfMemoryError(PuraxError):
  """A train step does not fit the device's memory: no configuration that
  :func:`purax.plan.fit_memory` tried fits the budget (the message names the
  smallest), or a step failed with XLA's ``RESOURCE_EXHAUSTED`` (the message
  names the configurations that would fit:
  :func:`purax.plan.memory.explain_out_of_memory`)."""


class CheckpointError(PuraxError):
  """A checkpoint could not be written or read (:mod:`purax.io.checkpoint`)."""


class CheckpointMismatchError(CheckpointError):
  """The checkpoint's structure, shapes or dtypes differ from the target's."""


def expect(condition: bool, field: str, expected: str, actual, cls=DataError) -> None:
  """Raises ``cls(f"{field}: expected {expected}, got {actual}")`` unless ``condition``."""
  if not condition:
    raise cls(f'{field}: expected {expected}, got {actual}')


def expect_kind(value, field: str, kinds, expected: str, cls=ConfigError) -> None:
  """Raises ``cls(f"{field}: expected {expected}, got {type} {value}")`` unless
  ``value`` is an instance of ``kinds`` (a type or a tuple of types): the
  up-front kind check of a public entry point's argument. A bool counts as a
  number only where ``kinds`` names ``bool``."""
  named = kinds if isinstance(kinds, tuple) else (kinds,)
  if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in named):
    raise cls(f'{field}: expected {expected}, got {type(value).__name__} '
              f'{reprlib.repr(value)}')
