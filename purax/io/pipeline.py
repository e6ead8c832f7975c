"""Batches from in-memory arrays with grain.

Training batches come from a grain ``MapDataset`` that is random access by
step: the batch of step ``s`` is ``ds[s]``, which makes resuming at any step
exact. Example order is a fresh permutation every epoch, drawn from
``numpy.random.default_rng([seed, epoch])`` (one vectorised permutation per
epoch, cached: grain's per-element ``shuffle`` cost more per example than a
small model's whole step), and the remainder of an epoch carries
into the next batch. Evaluation batches pad the last batch to a fixed
size and carry per-example weights (1 real, 0 padding), so every example counts
exactly once and the evaluation step compiles once. How a batch then gets to
the step (copy, stack, prefetch, transfer) is :mod:`purax.plan.feed`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from purax.core.errors import ConfigError, expect

# grain is imported on use: the core and the models need only jax, flax and optax
# (so benchmarks/lm.py runs on a GPU image without grain).
if TYPE_CHECKING:
  import grain


def _gather(x: np.ndarray, y: np.ndarray):
  def gather(indices: np.ndarray) -> dict[str, np.ndarray]:
    indices = np.asarray(indices)
    return {'x': x[indices], 'y': y[indices]}
  return gather


def fresh(ds):
  """``ds`` marked ``fresh_batches = True``: every read builds new arrays, so
  :func:`purax.fit` hands its batches to the step without a copy
  (:func:`purax.plan.feed.holds_its_batches`). Returns ``ds``."""
  ds.fresh_batches = True
  return ds


def train_dataset(x: np.ndarray, y: np.ndarray, *, batch_size: int, seed: int,
                  num_steps: int) -> grain.MapDataset:
  """A grain ``MapDataset`` of ``num_steps`` training batches, random access by step.

  Args:
    x: ``[n, ...]`` inputs; y: ``[n, ...]`` targets.
    batch_size: examples per batch (<= n).
    seed: shuffle seed; each epoch gets a different permutation.
    num_steps: number of batches.

  Returns:
    ``ds`` with ``len(ds) == num_steps`` and ``ds[s] == {'x': [batch, ...],
    'y': [batch, ...]}``, new arrays at every read (``ds.fresh_batches``:
    :func:`purax.fit` hands them to the step without a copy).

  Raises:
    ConfigError: ``batch_size`` not in ``[1, n]`` or ``num_steps < 1``.
  """
  n = len(x)
  expect(1 <= batch_size <= n, 'batch_size', f'in [1, {n}] (training examples)',
         batch_size, ConfigError)
  expect(num_steps >= 1, 'steps', '>= 1', num_steps, ConfigError)
  gather = _gather(x, y)

  @functools.lru_cache(maxsize=2)
  def permutation(epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)

  def batch_of_step(step: int) -> dict[str, np.ndarray]:
    start = step * batch_size
    first, offset = divmod(start, n)
    indices = permutation(first)[offset:offset + batch_size]
    if len(indices) < batch_size:   # the batch runs into the next epoch
      indices = np.concatenate([indices, permutation(first + 1)[:batch_size - len(indices)]])
    return gather(indices)

  import grain
  return fresh(grain.MapDataset.range(num_steps).map(batch_of_step))   # gathers new arrays


def eval_batches(x: np.ndarray, y: np.ndarray, *, batch_size: int) -> grain.MapDataset:
  """Fixed-size evaluation batches in order, the last padded with weight 0.

  Returns:
    ``ds[i] == {'x': [batch_size, ...], 'y': [batch_size], 'weight': float32
    [batch_size]}``; ``sum`` of weights over ``ds`` equals ``len(x)``.
  """
  n = len(x)
  expect(batch_size >= 1, 'eval_batch_size', '>= 1', batch_size, ConfigError)
  batch_size = min(batch_size, n)
  gather = _gather(x, y)

  def pad(indices):
    indices = np.asarray(indices)
    real = len(indices)
    weight = np.zeros((batch_size,), np.float32)
    weight[:real] = 1.0
    padded = np.concatenate([indices, np.zeros(batch_size - real, indices.dtype)])
    return dict(gather(padded), weight=weight)

  import grain
  return grain.MapDataset.range(n).batch(batch_size, drop_remainder=False).map(pad)


from purax.core import lazy as _lazy  # noqa: E402

# Batch staging moved to purax.plan.feed in 0.3 (io imports nothing of plan:
# docs/design.md, the import table); these spellings work, deprecated, until 0.4.
__getattr__, _ = _lazy.attach(__name__, {}, deprecated={
    name: (f'purax.plan.feed:{name}', f'purax.plan.feed.{name}', '0.4')
    for name in ('owned', 'prefetch_to_device')})
