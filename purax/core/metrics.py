"""Metrics as mergeable pytrees of sums and counts.

A metrics tree is a ``dict[str, Average | Sum]``. Trees merge across steps,
devices and population members by adding their leaves (``merge``), stay on the
device inside the training loop, and become Python numbers only in
``compute``, which does the one host transfer. The idea follows
``clu.metrics``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from purax.core.errors import ConfigError, expect


class Average(struct.PyTreeNode):
  """A weighted mean kept as ``total`` and ``count`` (float32 ``[]`` each)."""

  total: jax.Array
  count: jax.Array

  @classmethod
  def of(cls, values: jax.Array, weights: jax.Array | None = None) -> 'Average':
    """Average of ``values`` (any shape), weighted by ``weights`` (same shape)."""
    values = jnp.asarray(values, jnp.float32)
    if weights is None:
      weights = jnp.ones_like(values)
    weights = jnp.asarray(weights, jnp.float32)
    return cls(total=jnp.sum(values * weights), count=jnp.sum(weights))

  def merge(self, other: 'Average') -> 'Average':
    return Average(self.total + other.total, self.count + other.count)

  def compute(self):
    """``total / count``; NaN when nothing was counted."""
    count = np.asarray(self.count)
    with np.errstate(invalid='ignore', divide='ignore'):
      return np.where(count > 0, np.asarray(self.total) / count, np.nan)


class Sum(struct.PyTreeNode):
  """A running sum (float32 ``[]``), e.g. the number of examples seen."""

  value: jax.Array

  @classmethod
  def of(cls, values: jax.Array) -> 'Sum':
    return cls(value=jnp.sum(jnp.asarray(values, jnp.float32)))

  def merge(self, other: 'Sum') -> 'Sum':
    return Sum(self.value + other.value)

  def compute(self):
    return np.asarray(self.value)


class Streak(struct.PyTreeNode):
  """The longest run of consecutive flagged steps (e.g. skipped updates).

  ``current`` counts the flagged steps at the end of the window, ``longest``
  the longest run in it (int32 ``[]`` each). ``merge`` folds one step (or a
  window whose every step was flagged or not) onto a window, left to right;
  starting a new window (:func:`zeros_like`) keeps ``current``, so runs that
  cross log points are counted whole.
  """

  current: jax.Array
  longest: jax.Array

  @classmethod
  def of(cls, flagged: jax.Array) -> 'Streak':
    """A one-step streak: ``flagged`` is a bool ``[]``."""
    flag = jnp.asarray(flagged, jnp.int32)
    return cls(current=flag, longest=flag)

  def merge(self, other: 'Streak') -> 'Streak':
    current = jnp.where(other.current > 0, self.current + other.current, 0)
    return Streak(current=current, longest=jnp.maximum(jnp.maximum(self.longest, other.longest),
                                                        current))

  def compute(self):
    return np.asarray(self.longest)

  def reset(self) -> 'Streak':
    return Streak(current=self.current, longest=self.current)


Metric = Average | Sum | Streak
Metrics = Mapping[str, Metric]


def is_metric(x) -> bool:
  """Whether ``x`` is one of the metric classes (a leaf of a metrics tree)."""
  return isinstance(x, (Average, Sum, Streak))


#: The leaf dtypes a :class:`Window` holds exactly in float32 (integer counts
#: up to 2**24, far above any window's).
_PACKED_DTYPES = ('float32', 'int32', 'bool')


class Window(struct.PyTreeNode):
  """The metrics window (:mod:`purax.hooks.window`): the metrics tree the
  train steps of :mod:`purax.plan` sum from call to call, packed into one
  float32 array.

  The tree's leaves (float32 sums and counts, int32 streaks) are flattened
  and concatenated into ``values`` (float32 ``[n]``, ``n`` the leaves' total
  size: a population's ``[members]`` leaves included). A jitted step takes
  and returns one array instead of a dozen scalars, and merges them with one
  addition: each argument and output costs the call's dispatch and an XLA:CPU
  kernel of its own. :func:`merge`, :func:`zeros_like` and :func:`compute`
  take a window as they take a tree; :meth:`tree` gives the tree back (for a
  checkpoint, whose layout is the tree's).

  Attributes:
    values: float32 ``[n]`` (device or host array, or a ShapeDtypeStruct).
    treedef: the metrics tree's structure (static).
    leaves: ``(shape, dtype name)`` of each leaf, in order (static).
  """

  values: Any
  treedef: Any = struct.field(pytree_node=False)
  leaves: tuple = struct.field(pytree_node=False)

  def tree(self) -> dict[str, Metric]:
    """The metrics tree (numpy leaves for a host window, jax arrays otherwise)."""
    xp = np if isinstance(self.values, np.ndarray) else jnp
    out, at = [], 0
    for shape, dtype in self.leaves:
      size = math.prod(shape)   # Python ints: exact, and cheap on the host
      out.append(xp.reshape(self.values[at:at + size], shape).astype(dtype))
      at += size
    return jax.tree.unflatten(self.treedef, out)


def window(metrics) -> Window | Any:
  """``metrics`` (a tree of arrays or of ``jax.ShapeDtypeStruct``) packed into
  a :class:`Window`; a window as it is; a tree with a leaf of another dtype
  (float64, int64, ...) unchanged. Traceable."""
  if isinstance(metrics, Window):
    return metrics
  leaves, treedef = jax.tree.flatten(metrics)
  if not leaves or any(jnp.dtype(x.dtype).name not in _PACKED_DTYPES for x in leaves):
    return metrics
  spec = tuple((tuple(x.shape), jnp.dtype(x.dtype).name) for x in leaves)
  if all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves):
    size = sum(math.prod(shape) for shape, _ in spec)
    return Window(jax.ShapeDtypeStruct((size,), jnp.float32), treedef, spec)
  return Window(jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in leaves]),
                treedef, spec)


def as_tree(metrics) -> Any:
  """The metrics tree of a :class:`Window` (its layout in a checkpoint), or the tree itself."""
  return metrics.tree() if isinstance(metrics, Window) else metrics


def merge(a: Metrics | Window, b: Metrics | Window) -> dict[str, Metric] | Window:
  """Merges two metrics trees of the same structure (jit-safe); a
  :class:`Window` merged with a tree (or window) is a window."""
  if isinstance(a, Window) or isinstance(b, Window):
    return window(merge(as_tree(a), as_tree(b)))
  return jax.tree.map(lambda x, y: x.merge(y), a, b, is_leaf=is_metric)


def _zeros(metrics):
  if isinstance(metrics, Window):
    return window(_zeros(metrics.tree()))
  return jax.tree.map(lambda m: m.reset() if isinstance(m, Streak)
                      else jax.tree.map(jnp.zeros_like, m), metrics, is_leaf=is_metric)


_zeros_on_device = jax.jit(_zeros)


def stepped(step, state, acc, *args, **kwargs) -> tuple[Any, Any]:
  """``step(state, *args, **kwargs) -> (state, metrics)`` with its metrics
  merged into the metrics window ``acc``: the body of every accumulating train
  step (one device, a mesh, a population). Traceable."""
  state, metrics = step(state, *args, **kwargs)
  return state, merge(acc, metrics)


def zeros_of(fn, *args) -> Any:
  """The zeroed metrics tree of the structure ``fn(*args)`` returns (traced
  abstractly with ``jax.eval_shape``: nothing runs)."""
  return zeros_like(jax.eval_shape(fn, *args))


def zeros_like(metrics: Metrics | Window) -> dict[str, Metric] | Window:
  """A metrics tree (or :class:`Window`) of the same structure with every sum
  and count at 0.

  This starts a new window: a :class:`Streak` keeps its running count.

  Accepts concrete trees (zeroed on their device, no host transfer) or
  ``jax.ShapeDtypeStruct`` trees from ``eval_shape`` (one explicit transfer).
  """
  if all(isinstance(x, jax.Array) for x in jax.tree.leaves(metrics)):
    return _zeros_on_device(metrics)
  if isinstance(metrics, Window):
    return jax.device_put(metrics.replace(values=np.zeros(metrics.values.shape, np.float32)))
  return jax.device_put(jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), metrics))


def compute(metrics: Metrics | Window) -> dict[str, float | np.ndarray]:
  """Turns a metrics tree (or :class:`Window`) into numbers: one host transfer
  for the whole tree.

  Scalars come back as Python floats; metrics with a leading population axis
  come back as numpy arrays ``[members]``.
  """
  host = as_tree(jax.device_get(metrics))
  out = {}
  for name, metric in host.items():
    value = metric.compute()
    out[name] = float(value) if np.ndim(value) == 0 else value
  return out


#: The directions a metric can be better in.
MODES = ('min', 'max')


def to_minimise(value, mode: str):
  """float32 scores to minimise: ``value`` negated for ``mode='max'``,
  non-finite values ``+inf`` (worst). A number or numpy array gives numpy (no
  device work); a jax array (traced too) gives a jax array."""
  xp = jnp if isinstance(value, jax.Array) else np
  value = xp.asarray(value, xp.float32)
  value = -value if mode == 'max' else value
  return xp.where(xp.isfinite(value), value, xp.float32(np.inf))


@dataclasses.dataclass(frozen=True)
class Best:
  """Which logged metric ranks, and which way is better: the one rule of
  ``--keep-best`` (:class:`purax.io.checkpoint.Checkpointer`), early stopping
  (:class:`purax.hooks.EarlyStopping`, ``--patience``), and the ranking of
  population members (:func:`purax.core.population.score`, PBT).

  Example: ``Best('eval/loss', 'min').score({'eval/loss': 0.3})`` is ``0.3``;
  ``Best('eval/accuracy', 'max')`` scores ``-accuracy``; NaN scores ``+inf``.

  Attributes:
    metric: a logged name (``'eval/loss'``, ``'train/loss'``,
      ``'eval_ema/accuracy'``, anything a hook writes); a bare name
      (``'loss'``) means ``'eval/' + name``.
    mode: ``'min'`` or ``'max'``.

  Raises:
    ConfigError: an empty metric name or an unknown mode.
  """

  metric: str = 'eval/loss'
  mode: str = 'min'

  def __post_init__(self):
    expect(isinstance(self.metric, str) and bool(self.metric.strip('/')), 'best_metric',
           "a logged metric name, e.g. 'eval/loss'", repr(self.metric), ConfigError)
    expect(self.mode in MODES, 'best_mode', "'min' or 'max'", repr(self.mode), ConfigError)

  @property
  def key(self) -> str:
    """The full logged name (``'eval/loss'`` for ``'loss'``)."""
    return self.metric if '/' in self.metric else f'eval/{self.metric}'

  def score(self, record: Mapping[str, Any]):
    """The score to minimise of ``record[key]`` (a number, or ``[members]``),
    by :func:`to_minimise`.

    Raises:
      ConfigError: ``record`` has no ``key`` (naming what it has).
    """
    expect(self.key in record, 'best_metric', f'one of {sorted(record)} (written at this step)',
           repr(self.key), ConfigError)
    return to_minimise(np.asarray(record[self.key], np.float32), self.mode)
