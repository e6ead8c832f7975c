"""A step's memory budget: the device's memory less a margin, or a size given in words.

:func:`default_budget` is what :func:`purax.plan.fit_memory` and
``purax train --fit-memory`` use without ``--memory-budget``; a CPU reports
no device limit, and then the host's available memory stands in (and the
budget says so).
"""

from __future__ import annotations

import math
import re

import jax
import numpy as np

from purax.core import summary as summary_lib
from purax.core.errors import ConfigError, expect

#: Share of the device's memory kept out of the default budget: the batches
#: prefetched to the device, the runtime's own buffers, fragmentation.
MARGIN = 0.10


def parse_bytes(text: str | int, field: str = 'memory_budget') -> int:
  """``'8GiB'``, ``'512 MiB'``, ``'1.5e9'``, ``'2GB'`` or an int -> bytes.

  Raises:
    ConfigError: not a positive size, naming ``field``.
  """
  units = {'': 1, 'b': 1, 'kb': 10 ** 3, 'mb': 10 ** 6, 'gb': 10 ** 9, 'tb': 10 ** 12,
           'kib': 2 ** 10, 'mib': 2 ** 20, 'gib': 2 ** 30, 'tib': 2 ** 40}
  if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
    value = float(text)
  else:
    m = re.fullmatch(r'\s*((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*',
                     str(text))
    unit = m.group(2).lower() if m else None
    expect(m is not None and unit in units, field,
           "a size such as '8GiB', '512MiB', '2GB' or a number of bytes", repr(text),
           ConfigError)
    value = float(m.group(1)) * units[unit]
  expect(math.isfinite(value) and value >= 1, field, 'a size of at least 1 byte', repr(text),
         ConfigError)
  return int(value)


def available_bytes(device=None) -> int | None:
  """Memory a step may use on ``device`` (default the first): the
  accelerator's allocator limit, or on a CPU the host's available memory
  (``MemAvailable``); None when unknown."""
  device = jax.devices()[0] if device is None else device
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  if stats and stats.get('bytes_limit'):
    return int(stats['bytes_limit'])
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:    # not Linux: unknown
    return None
  return None


def default_budget(device=None) -> tuple[int, str]:
  """``(bytes, words)``: the device's memory less :data:`MARGIN`.

  Raises:
    ConfigError: the device reports no limit and the host's memory is unknown.
  """
  device = jax.devices()[0] if device is None else device
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  limit = available_bytes(device)
  expect(limit is not None, 'budget_bytes', 'a number of bytes (this device reports no memory '
         'limit and the host no available memory)', 'None', ConfigError)
  budget = int(limit * (1 - MARGIN))
  keep = f'{1 - MARGIN:.0%}'
  if stats and stats.get('bytes_limit'):
    return budget, f"{keep} of {device.device_kind}'s {summary_lib.human_bytes(limit)}"
  return budget, (f"{keep} of the host's available {summary_lib.human_bytes(limit)} "
                  f'({device.platform} reports no device memory limit)')
