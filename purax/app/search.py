"""Search spaces for sweeps: grids, (log-)uniform draws and ``--flag`` specs.

Each helper returns the population's hyperparameter pytree: name -> float32
``[members]`` (plus int32 ``[members]`` seeds), ready for
:func:`purax.core.population.init`. Specs as the command line takes them:

- ``1e-4,3e-4,1e-3``: a list; lists and ``--seeds`` form a Cartesian grid;
- ``loguniform:1e-5:1e-2`` / ``uniform:0:0.2``: drawn once per member
  (``--members``); grid points are then assigned to members in turn.

Bergstra & Bengio 2012, "Random Search for Hyper-Parameter Optimization".
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from purax.core.errors import ConfigError, expect

# -- search spaces ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Uniform:
  """``uniform:LOW:HIGH`` (``log=False``) or ``loguniform:LOW:HIGH`` (``log=True``)."""

  low: float
  high: float
  log: bool = False

  def sample(self, key: jax.Array, members: int) -> jax.Array:
    """float32 ``[members]`` draws (log-uniform: uniform in ``log(value)``)."""
    if self.log:
      return log_uniform(key, self.low, self.high, members)
    return jax.random.uniform(key, (members,), jnp.float32, self.low, self.high)


def log_uniform(key: jax.Array, low: float, high: float, members: int) -> jax.Array:
  """float32 ``[members]`` values with ``log(value)`` uniform in ``[log low, log high)``.

  Raises:
    ConfigError: unless ``0 < low <= high``.
  """
  expect(0 < low <= high, 'log_uniform bounds', '0 < low <= high', (low, high), ConfigError)
  u = jax.random.uniform(key, (members,), jnp.float32, math.log(low), math.log(high))
  return jnp.exp(u)


def parse_spec(field: str, text: str) -> tuple[float, ...] | Uniform:
  """Parses a ``--FIELD`` spec: ``a,b,c``, ``loguniform:lo:hi`` or ``uniform:lo:hi``.

  Raises:
    ConfigError: a malformed spec, naming the field, the expected form and
      the text given (bounds: :meth:`purax.app.hparam_table.HParam.check`).
  """
  form = "'v1,v2,...', 'loguniform:LOW:HIGH' or 'uniform:LOW:HIGH'"
  text = str(text).strip()
  try:
    if ':' in text:
      kind, low, high = text.split(':')
      expect(kind in ('loguniform', 'uniform'), f'--{field}', form, repr(text), ConfigError)
      spec = Uniform(float(low), float(high), log=kind == 'loguniform')
      expect(spec.low <= spec.high and (spec.low > 0 or not spec.log), f'--{field}',
             'LOW <= HIGH (and LOW > 0 for loguniform)', repr(text), ConfigError)
      values = (spec.low, spec.high)
    else:
      spec = values = tuple(float(v) for v in text.split(','))
      repeated = sorted({v for v in values if values.count(v) > 1})
      expect(not repeated, f'--{field}', 'distinct values (a repeated value would train the '
             'same member twice)', f'{text!r} (repeats {", ".join(map(repr, repeated))})',
             ConfigError)
  except ValueError as e:
    if isinstance(e, ConfigError):
      raise
    raise ConfigError(f'--{field}: expected {form}, got {text!r}') from None
  return spec


def parse_seeds(text: str) -> tuple[int, ...]:
  """Parses ``--seeds 0,1,2`` into non-negative integers.

  Raises:
    ConfigError: naming ``--seeds``.
  """
  try:
    seeds = tuple(int(s) for s in str(text).split(','))
  except ValueError:
    raise ConfigError(f"--seeds: expected comma-separated integers like '0,1,2', "
                      f'got {text!r}') from None
  expect(all(s >= 0 for s in seeds), '--seeds', 'integers >= 0', repr(text), ConfigError)
  return seeds


def grid(values: Mapping[str, Sequence[float]], seeds: Sequence[int] = (0,)):
  """The Cartesian product of hyperparameter lists and seeds.

  Returns:
    ``(seeds, hparams)``: int32 ``[members]`` and name -> float32 ``[members]``,
    ``members = len(seeds) * prod(len(v))``; seeds vary fastest.
  """
  names = list(values)
  points = list(itertools.product(*(values[n] for n in names), seeds))
  hparams = {n: np.asarray([p[j] for p in points], np.float32) for j, n in enumerate(names)}
  return np.asarray([p[-1] for p in points], np.int32), hparams


def members_from_specs(specs: Mapping[str, tuple[float, ...] | Uniform],
                       seeds: Sequence[int], members: int | None, *, key: jax.Array):
  """Grid over list specs and seeds, random draws for distribution specs.

  Without distributions the population is the grid (``members`` must be None
  or equal its size). With them there are ``members`` members (required: a
  random search has no natural size); member ``i`` takes grid point
  ``i % grid size`` and its own draws.

  Returns:
    ``(seeds, hparams)`` as :func:`grid`.

  Raises:
    ConfigError: ``members < 1``, unset with a distribution, or inconsistent
      with a pure grid.
  """
  lists = {n: s for n, s in specs.items() if not isinstance(s, Uniform)}
  dists = {n: s for n, s in specs.items() if isinstance(s, Uniform)}
  grid_seeds, hparams = grid(lists, seeds)
  size = len(grid_seeds)
  if members is not None:
    expect(members >= 1, 'members', '>= 1', members, ConfigError)
  if not dists:
    expect(members is None or members == size, 'members',
           f'unset or {size} (the grid size) when no spec is random', members, ConfigError)
    return grid_seeds, hparams
  expect(members is not None, 'members', 'a population size when a spec is random '
         f'({", ".join(sorted(dists))})', 'unset', ConfigError)
  idx = np.arange(members) % size
  hparams = {n: v[idx] for n, v in hparams.items()}
  for k, (name, dist) in zip(jax.random.split(key, len(dists)), sorted(dists.items())):
    hparams[name] = np.asarray(dist.sample(k, members))
  return grid_seeds[idx], hparams
