"""Hypothesis strategies for property tests of a step on any mesh: meshes,
batch sizes that split evenly, classification batches, small pytrees.
Strategies touch devices only when drawn, never at import."""

import math
from typing import Mapping, Sequence

import jax
import numpy as np
from hypothesis import strategies as st

from purax.parallel.mesh import AXES, make_mesh
from purax.parallel.rules import Rules, data_parallel


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def mesh_shapes(draw, num_devices: int | None = None,
                axes: Sequence[str] = AXES) -> dict[str, int]:
  """Mesh axis sizes ``{'data': d, 'fsdp': f, 'tensor': t}`` using a divisor of the devices.

  Args:
    num_devices: devices available (default ``jax.device_count()``, read when drawn).
    axes: the axes that may be larger than 1; the others are 1.

  Shrinks towards small meshes (1 device).
  """
  n = num_devices or jax.device_count()
  total = draw(st.sampled_from(_divisors(n)))
  sizes = {a: 1 for a in AXES}
  rest = total
  for a in axes[:-1]:
    sizes[a] = draw(st.sampled_from(_divisors(rest)))
    rest //= sizes[a]
  sizes[axes[-1]] = rest
  return sizes


def mesh_of(sizes: Mapping[str, int]) -> jax.sharding.Mesh:
  """:func:`purax.parallel.make_mesh` over the first ``prod(sizes)`` devices."""
  devices = jax.devices()[:math.prod(sizes.values())]
  return make_mesh(**sizes, devices=devices)


def meshes(num_devices: int | None = None, axes: Sequence[str] = AXES):
  """Meshes (``jax.sharding.Mesh``) that fit the available devices."""
  return mesh_shapes(num_devices, axes).map(mesh_of)


def batch_sizes(mesh: jax.sharding.Mesh, rules: Rules | None = None,
                max_per_shard: int = 4, *, candidates: Sequence[int] | None = None):
  """Global batch sizes the mesh splits evenly over ``rules.batch_axes``.

  Args:
    mesh, rules: the layout (default rules: data parallel).
    max_per_shard: draw ``k * split`` for ``k`` in ``[1, max_per_shard]``.
    candidates: instead, draw from these sizes those that ``split`` divides
      (fewer distinct shapes: fewer compilations in a property test).
  """
  rules = rules or data_parallel()
  split = math.prod(mesh.shape[a] for a in rules.batch_axes)
  if candidates is not None:
    fits = [b for b in candidates if b % split == 0]
    assert fits, f'no batch size among {candidates} is a multiple of {split}'
    return st.sampled_from(fits)
  return st.integers(1, max_per_shard).map(lambda k: k * split)


@st.composite
def classification_batches(draw, batch_size: int, input_shape: Sequence[int],
                           num_classes: int, steps: int = 1,
                           weighted: bool = False) -> list[dict[str, np.ndarray]]:
  """``steps`` batches ``{'x': float32 [batch, *input_shape], 'y': int32 [batch]}``.

  Values come from a drawn seed (numpy), so examples are cheap to generate and
  to shrink. With ``weighted``, a float32 ``'weight'`` of 0s and 1s (not all 0).
  """
  seed = draw(st.integers(0, 2**16))
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(steps):
    batch = {'x': rng.normal(size=(batch_size, *input_shape)).astype(np.float32),
             'y': rng.integers(0, num_classes, batch_size).astype(np.int32)}
    if weighted:
      w = (rng.random(batch_size) < 0.7).astype(np.float32)
      w[0] = 1.0
      batch['weight'] = w
    out.append(batch)
  return out


def small_pytrees(max_leaves: int = 4, max_dim: int = 8):
  """Dicts of 1 to ``max_leaves`` float32 arrays of rank 0-2, dims ``<= max_dim``."""
  shape = st.lists(st.integers(1, max_dim), min_size=0, max_size=2).map(tuple)

  @st.composite
  def leaf(draw):
    s = draw(shape)
    seed = draw(st.integers(0, 2**16))
    return np.random.default_rng(seed).normal(size=s).astype(np.float32)

  return st.dictionaries(st.text('abcdefgh', min_size=1, max_size=3), leaf(),
                         min_size=1, max_size=max_leaves)


