"""Which batch a state's params were built from: to name a batch of the wrong shape.

A model's parameters are shaped by the batch ``task.init`` was given; a later
batch of another per-example shape fails deep inside the model (flax's
``ScopeParamShapeError: For parameter "kernel" in "/Conv_0" ...``, a
``dot_general`` shape error), naming a parameter, not the batch. :func:`record`
(called by :meth:`purax.Task.init`, traced or not) remembers, per task and
params shapes, the per-example shape of every batch field; when applying the
model fails, :func:`mismatch` compares the batch with it and names the first
field that differs, with both shapes. Nothing is checked on the way that
works (a language model may see other sequence lengths than it was built
with), and nothing is added to the state.

The table is a bounded cache of trace-time facts (shapes), like jit's own:
the newest :data:`CAPACITY` (task, params shapes) pairs.
"""

from __future__ import annotations

import collections
from typing import Any

import jax
import numpy as np

#: (task, params signature) pairs remembered.
CAPACITY = 256

_built: collections.OrderedDict = collections.OrderedDict()


def _signature(params) -> tuple:
  return tuple((jax.tree_util.keystr(path), tuple(np.shape(x)), str(getattr(x, 'dtype', '')))
               for path, x in jax.tree_util.tree_flatten_with_path(params)[0])


def _fields(batch) -> dict[str, tuple[int, ...]]:
  """``{'batch['x']': per-example shape}`` of the array leaves of ``batch``."""
  out = {}
  for path, x in jax.tree_util.tree_flatten_with_path(batch)[0]:
    shape = np.shape(x)
    if shape:
      out[f'batch{jax.tree_util.keystr(path)}'] = tuple(shape)
  return out


def record(task: Any, params: Any, batch: Any) -> None:
  """Remembers that ``task.init`` built ``params`` from ``batch`` (its shapes)."""
  try:
    key = (task, _signature(params))
    hash(key)
  except TypeError:      # an unhashable task: nothing to key it by
    return
  _built[key] = _fields(batch)
  _built.move_to_end(key)
  while len(_built) > CAPACITY:
    _built.popitem(last=False)


def mismatch(task: Any, params: Any, batch: Any) -> str | None:
  """The message naming the first field of ``batch`` whose per-example shape
  differs from the batch ``params`` were built from, or None (unknown, or
  no field differs).

  Example: ``"batch['x'].shape: expected [batch, 8, 8, 1] (the batch
  task.init built the params from), got (5, 8, 8, 3)"``.
  """
  try:
    built = _built.get((task, _signature(params)))
  except TypeError:
    return None
  if built is None:
    return None
  for field, shape in _fields(batch).items():
    want = built.get(field)
    if want is not None and (len(want) != len(shape) or want[1:] != shape[1:]):
      dims = ', '.join(map(str, want[1:]))
      return (f"{field}.shape: expected [batch{', ' if dims else ''}{dims}] (the batch "
              f'task.init built the params from), got {shape}')
  return None
