"""The valid interval of each hyperparameter: one table (:data:`BOUNDS`),
read by every optimizer builder (:func:`purax.adamw`, the optimizers of
:mod:`purax.core.optimizers`: :func:`check`), :func:`purax.core.hparams.set`
and populations (:func:`purax.core.hparams.check`), the command line (its
checks and its ``--help``, without jax) and PBT (which clips to it). A value
outside its interval is refused by each of them with the same
:class:`~purax.core.errors.ConfigError`: ``NAME: expected a finite value in
INTERVAL[ (WHY)], got VALUE``."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Mapping

from purax.core import lazy
from purax.core.errors import ConfigError, expect, expect_kind

np = lazy.module('numpy')   # clip() only: the command line reads this table, numpy not needed


@dataclasses.dataclass(frozen=True)
class Bounds:
  """An interval of valid values: ``[low, high]``, ``low_open`` / ``high_open``
  excluding an end; ``why``: what a value outside would do (said in the error)."""

  low: float
  high: float
  low_open: bool = False
  high_open: bool = False
  why: str = ''

  def interval(self) -> str:
    return (f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
            f"{')' if self.high_open else ']'}")

  def contains(self, value: float) -> bool:
    return (math.isfinite(value)
            and (self.low < value if self.low_open else self.low <= value)
            and (value < self.high if self.high_open else value <= self.high))

  def check(self, value: float, name: str) -> None:
    """Raises ConfigError naming ``name`` unless ``value`` is finite and inside."""
    expect(self.contains(float(value)), name, f'a finite value in {self.interval()}'
           + (f' ({self.why})' if self.why else ''), value, ConfigError)

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
#: name in the state (the builder's argument, the config field and the
#: ``--flag`` are the same name). Others: ``[0, inf)``. A rule between two
#: arguments, or of one algorithm only (schedule-free's ``b1 > 0``, Adam's
#: ``eps > 0`` unless ``eps_root > 0``), is its builder's, on top of this.
BOUNDS: Mapping[str, Bounds] = {
    'learning_rate': Bounds(0.0, 10.0, low_open=True),
    'weight_decay': Bounds(0.0, 1.0),
    'b1': Bounds(0.0, 1.0, high_open=True),
    'b2': Bounds(0.0, 1.0, high_open=True),
    'clip_norm': Bounds(0.0, math.inf, low_open=True, high_open=True,
                        why='gradients are rescaled to at most this norm: 0 would zero them'),
    'momentum': Bounds(0.0, 1.0, high_open=True),
    'label_smoothing': Bounds(0.0, 1.0, high_open=True),
    'eps': Bounds(0.0, math.inf, high_open=True),
    # The warmup-stable-decay schedule's (purax.core.optim.warmup_stable_decay), in steps.
    'decay_start': Bounds(0.0, math.inf, high_open=True),
    'cooldown_steps': Bounds(0.0, math.inf, low_open=True, high_open=True,
                             why='the cooldown divides by its length'),
}

#: Hyperparameter names of purax before 0.3 -> today's (issue #45: one name
#: from ``--learning-rate`` to the log). :func:`purax.core.hparams.set` (and
#: what calls it: populations, PBT) takes an old name until 0.4 with a
#: ``DeprecationWarning``; a checkpoint, or a sweep's ``sweep.json``, that
#: holds an old name is read under the new one.
RENAMED: Mapping[str, str] = {'peak_learning_rate': 'learning_rate'}

#: The interval of a hyperparameter without a row in :data:`BOUNDS`.
DEFAULT_BOUNDS = Bounds(0.0, math.inf, high_open=True)


def bounds(name: str) -> Bounds:
  """The interval of hyperparameter ``name``: its row of :data:`BOUNDS`, else :data:`DEFAULT_BOUNDS`."""
  return BOUNDS.get(name, DEFAULT_BOUNDS)


def check(**values: float) -> None:
  """Checks each builder argument ``name=value`` against :func:`bounds` of its name.

  Example: ``check(learning_rate=20.0)`` raises ``ConfigError('learning_rate:
  expected a finite value in (0, 10], got 20.0')``.

  Raises:
    ConfigError: a value that is not a real number, not finite, or outside
      its interval: ``NAME: expected a finite value in INTERVAL[ (WHY)], got VALUE``.
  """
  for name, value in values.items():
    expect_kind(value, name, numbers.Real, 'a finite number')
    bounds(name).check(value, name)
