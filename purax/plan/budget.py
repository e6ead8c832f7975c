"""A step's memory budget: the device's memory less a margin, or a size given in words.

:func:`default_budget` is what :func:`purax.plan.fit_memory` and
``purax train --fit-memory`` use without ``--memory-budget``; a CPU reports
no device limit, and then the host's available memory stands in (and the
budget says so). :func:`expect_fits` is the one check of an option that
sizes an allocation (``--spike-window``, a sweep's members, ``--num-lrs``,
``--batch-size``): the bytes it needs against the bytes available, before
anything of that size is allocated.
"""

from __future__ import annotations

import math
import re

import jax
import numpy as np

from purax.core import lazy
from purax.core.errors import ConfigError, expect

# Inspection is off the step's path (tests/inspect/test_moved.py): imported on use.
summary_lib = lazy.module('purax.inspect.summary')

#: Needs of at most this many bytes pass :func:`expect_fits` without asking
#: the device: every device has that much, and a config check of ordinary
#: values then touches no device (nor starts a backend before a multi-host
#: run has connected).
ALWAYS_FITS = 64 * 2 ** 20

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


def _where(device) -> str:
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  if stats and stats.get('bytes_limit'):
    return f'on {device.device_kind}'
  return f"the host's available memory: {device.platform} reports no device memory limit"


def expect_fits(need: int, field: str, value, expected: str, *, how: str = '',
                hint: str = '', device=None, available: int | None = None) -> None:
  """Raises unless ``need`` bytes fit in the memory available: the check of an
  option that sizes an allocation, made before anything of that size exists.

  The message reads ``FIELD: expected EXPECTED fits in the 30.00 GiB
  available (WHERE; HINT), got VALUE, needing 7.45 GiB (HOW)``, e.g.
  ``expect_fits(8 * window, 'spike_window', window, 'a window whose state')``.

  Args:
    need: the bytes the value needs.
    field: the option, as the message names it.
    value: its value.
    expected: what it should be, completed by "fits in ...".
    how: what ``need`` counts (optional).
    hint: what to change (optional).
    device: whose memory (default the first device; :func:`available_bytes`).
    available: the bytes available, instead of asking ``device``.

  Raises:
    ConfigError: ``need`` exceeds the bytes available (unknown: passes;
      at most :data:`ALWAYS_FITS`: passes without asking the device).
  """
  if need <= ALWAYS_FITS and available is None:
    return
  device = jax.devices()[0] if device is None and available is None else device
  have = available_bytes(device) if available is None else available
  if have is None or need <= have:
    return
  where = _where(device) if device is not None else 'as given'
  detail = f'{where}; {hint}' if hint else where
  raise ConfigError(f'{field}: expected {expected} fits in the {summary_lib.human_bytes(have)} '
                    f'available ({detail}), got {value}, needing '
                    f'{summary_lib.human_bytes(need)}' + (f' ({how})' if how else ''))
