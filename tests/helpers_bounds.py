"""What the tests of the bounds table share (tests/core/test_bounds.py,
tests/app/test_hparam_table.py): values just outside a row's interval, and
the one message that refuses them; the optimizer builders by name."""

import re

import numpy as np

import purax
from purax.core import bounds as bounds_lib
from purax.core import optimizers

BUILDERS = {'adamw': purax.adamw, 'sgd': optimizers.sgd, 'muon': optimizers.muon,
            'schedule_free_adamw': optimizers.schedule_free_adamw}


def outside(b: bounds_lib.Bounds) -> list[float]:
  """Values just outside ``b`` (each end that is finite)."""
  values = [b.low if b.low_open else b.low - 1.0]
  if np.isfinite(b.high):
    values.append(b.high * 2 + 1 if not b.high_open else b.high)
  return values


def refused(name: str, value: float, prefix: str = '', member: str = '') -> str:
  """The one message: ``[prefix]NAME[member]: expected a finite value in INTERVAL, got VALUE``."""
  b = bounds_lib.bounds(name)
  expected = b.interval() + (f' ({b.why})' if b.why else '')
  return (f'^{re.escape(prefix)}{name}{re.escape(member)}: expected a finite value in '
          f'{re.escape(expected)}, got {re.escape(str(value))}$')
