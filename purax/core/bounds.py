"""The valid interval of each hyperparameter: one table (:data:`BOUNDS`),
read by :mod:`purax.core.hparams`, the command line (its checks and its
``--help``, without jax) and PBT (which clips to it)."""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from purax.core import lazy
from purax.core.errors import ConfigError, expect

np = lazy.module('numpy')   # clip() only: the command line reads this table, numpy not needed


@dataclasses.dataclass(frozen=True)
class Bounds:
  """An interval of valid values: ``[low, high]``, ``low_open`` / ``high_open``
  excluding an end."""

  low: float
  high: float
  low_open: bool = False
  high_open: bool = False

  def interval(self) -> str:
    return (f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
            f"{')' if self.high_open else ']'}")

  def contains(self, value: float) -> bool:
    return (math.isfinite(value)
            and (self.low < value if self.low_open else self.low <= value)
            and (value < self.high if self.high_open else value <= self.high))

  def check(self, value: float, name: str) -> None:
    """Raises ConfigError naming ``name`` unless ``value`` is finite and inside."""
    expect(self.contains(float(value)), name, f'a finite value in {self.interval()}', value,
           ConfigError)

  def clip(self) -> tuple[float, float]:
    """The closed float32 interval a perturbed value is clipped to (PBT)."""
    lo, hi = np.float32(self.low), np.float32(min(self.high, np.finfo(np.float32).max))
    if self.low_open:
      lo = np.nextafter(lo, np.float32(np.inf))
    if self.high_open:
      hi = np.nextafter(hi, np.float32(-np.inf))
    return float(lo), float(hi)


#: The valid interval of each hyperparameter of :func:`purax.adamw`, the
#: optimizers of :mod:`purax.core.optimizers` and the provided losses, by its
#: name in the state. Others: ``[0, inf)``.
BOUNDS: Mapping[str, Bounds] = {
    'peak_learning_rate': Bounds(0.0, 10.0, low_open=True),
    'learning_rate': Bounds(0.0, 10.0, low_open=True),
    'weight_decay': Bounds(0.0, 1.0),
    'b1': Bounds(0.0, 1.0, high_open=True),
    'b2': Bounds(0.0, 1.0, high_open=True),
    'clip_norm': Bounds(0.0, math.inf, low_open=True, high_open=True),
    'momentum': Bounds(0.0, 1.0, high_open=True),
    'label_smoothing': Bounds(0.0, 1.0, high_open=True),
}

#: The interval of a hyperparameter without a row in :data:`BOUNDS`.
DEFAULT_BOUNDS = Bounds(0.0, math.inf, high_open=True)


def bounds(name: str) -> Bounds:
  return BOUNDS.get(name, DEFAULT_BOUNDS)
