"""Device meshes over all devices of all processes, with named axes.

purax's meshes have up to three named axes, always in this order:

- ``'data'``: the batch is split over it; parameters are replicated;
- ``'fsdp'``: the batch is split over it too, and parameters and optimizer
  state above a size threshold are split over it (ZeRO-3 / FSDP);
- ``'tensor'``: parameters are split over it by the logical-axis rule table
  (Megatron-style tensor parallelism); the batch is replicated over it.

The axis order puts ``'tensor'`` innermost, so on real hardware the most
talkative axis spans the nearest devices. Axes are ``AxisType.Auto``: the
compiler (GSPMD) propagates shardings from the step's inputs and outputs.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import jax
from jax.sharding import AxisType, Mesh

from purax.core.errors import ConfigError, expect

AXES = ('data', 'fsdp', 'tensor')


def _resolve(sizes: dict[str, int], num_devices: int) -> dict[str, int]:
  """Fills the one ``-1`` axis with "the rest" and checks the product."""
  for name, size in sizes.items():
    expect(isinstance(size, int) and (size >= 1 or size == -1), f'mesh.{name}',
           'a positive int or -1 (the rest of the devices)', repr(size), ConfigError)
  rest = [name for name, size in sizes.items() if size == -1]
  expect(len(rest) <= 1, 'mesh', 'at most one axis of size -1', f'{rest} are -1',
         ConfigError)
  known = math.prod(size for size in sizes.values() if size != -1)
  if rest:
    expect(num_devices % known == 0, f'mesh.{rest[0]}',
           f'an axis size such that the mesh fills {num_devices} devices, but the other '
           f'axes multiply to {known}, which does not divide {num_devices}',
           f'{rest[0]}=-1 with {sizes}', ConfigError)
    sizes = dict(sizes, **{rest[0]: num_devices // known})
  expect(math.prod(sizes.values()) == num_devices, 'mesh',
         f'axis sizes multiplying to the {num_devices} devices '
         f'(use -1 on one axis for "the rest")',
         ' x '.join(f'{k}={v}' for k, v in sizes.items()) +
         f' = {math.prod(sizes.values())}', ConfigError)
  return sizes


def make_mesh(data: int | None = None, fsdp: int = 1, tensor: int = 1, *,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ``('data', 'fsdp', 'tensor')`` mesh over all devices of all processes.

  Args:
    data: size of the ``'data'`` axis; ``-1`` for the rest; default (None):
      the rest, or 1 when another axis is ``-1``.
    fsdp: size of the ``'fsdp'`` axis.
    tensor: size of the ``'tensor'`` axis.
    devices: the devices to lay out (default ``jax.devices()``: every device
      of every process, so the same call works on one host or many).

  Returns:
    A ``jax.sharding.Mesh`` of shape ``[data, fsdp, tensor]`` with Auto axes.

  Raises:
    ConfigError: a size not a positive int or -1; more than one -1; sizes whose
      product is not the device count (the message names both).

  Example (8 devices):
    >>> dict(parallel.make_mesh(data=4, fsdp=2).shape)
    {'data': 4, 'fsdp': 2, 'tensor': 1}
    >>> dict(parallel.make_mesh(data=-1, tensor=2).shape)    # data = devices / 2
    {'data': 4, 'fsdp': 1, 'tensor': 2}
  """
  devices = list(jax.devices() if devices is None else devices)
  if data is None:
    data = 1 if -1 in (fsdp, tensor) else -1
  sizes = _resolve({'data': data, 'fsdp': fsdp, 'tensor': tensor}, len(devices))
  shape = tuple(sizes[a] for a in AXES)
  return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES),
                       devices=devices)


def parse_mesh(spec: str) -> dict[str, int]:
  """Parses ``'data=4,fsdp=2'`` (the CLI's ``--mesh``) into ``make_mesh`` kwargs.

  Raises:
    ConfigError: malformed text, an unknown axis, a repeated axis.
  """
  out: dict[str, int] = {}
  for part in filter(None, (p.strip() for p in spec.split(','))):
    m = re.fullmatch(r'(\w+)\s*=\s*(-?\d+)', part)
    expect(m is not None, 'mesh', "'AXIS=SIZE,...', e.g. 'data=4,fsdp=2'", repr(spec),
           ConfigError)
    name, size = m.group(1), int(m.group(2))
    expect(name in AXES, 'mesh axis', f'one of {AXES}', repr(name), ConfigError)
    expect(name not in out, 'mesh', 'each axis at most once', f'{name!r} repeated',
           ConfigError)
    out[name] = size
  expect(bool(out), 'mesh', "'AXIS=SIZE,...', e.g. 'data=4,fsdp=2'", repr(spec),
         ConfigError)
  return out
