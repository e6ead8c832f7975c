"""Sharding rules: how each array of a state or batch is laid out on a mesh.

A :class:`Rules` value chooses the strategy; the step is never rewritten:

- data parallel (:func:`data_parallel`): the batch's leading axis is split over
  the mesh's batch axes (``'data'`` and ``'fsdp'``); every parameter and
  optimizer-state array is replicated. XLA inserts one all-reduce of the
  gradients.
- FSDP (:func:`fsdp`): as data parallel, and every parameter / optimizer-state
  array with at least ``fsdp_min_size`` elements is split over ``'fsdp'``
  along its largest dimension divisible by the axis size; smaller arrays
  (biases, scalars, norms) stay replicated. XLA all-gathers parameters for
  the forward pass and reduce-scatters gradients (ZeRO-3).
- tensor parallel (:func:`tensor_parallel`): parameters carry logical axis
  names from ``flax.linen.with_logical_partitioning`` (``('embed', 'mlp')``
  on a kernel); the rule table maps logical names to mesh axes
  (``'mlp' -> 'tensor'``). Names without a rule are replicated.

The three compose: ``tensor_parallel(fsdp_min_size=...)`` also splits the
remaining dimensions of large arrays over ``'fsdp'``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from jax.sharding import Mesh, PartitionSpec as P

from purax.core.errors import ConfigError, expect

MeshAxes = str | tuple[str, ...] | None

#: The default logical-axis table of purax.nn's models (Megatron pairing: a
#: column-parallel kernel ``('embed', 'mlp')`` followed by a row-parallel one
#: ``('mlp', 'embed')``, so one all-reduce per pair in the forward pass).
DEFAULT_TABLE: tuple[tuple[str, MeshAxes], ...] = (
    ('mlp', 'tensor'),
    ('heads', 'tensor'),
    ('embed', None),
    ('classes', None),
    ('conv_in', None),
    ('conv_out', None),
)


@dataclasses.dataclass(frozen=True)
class Rules:
  """A sharding strategy.

  Attributes:
    batch_axes: mesh axes the batch's leading dimension is split over (in
      this order); axes missing from the mesh are an error.
    fsdp_axis: mesh axis that large parameter and optimizer-state arrays are
      split over; None for no FSDP.
    fsdp_min_size: arrays with fewer elements stay replicated under FSDP
      (splitting them costs more in collectives than it saves in memory).
    table: the logical-axis rule table, ``((logical_name, mesh_axes), ...)``;
      the first entry naming a logical axis wins. Empty: no tensor parallel.
  """

  batch_axes: tuple[str, ...] = ('data', 'fsdp')
  fsdp_axis: str | None = None
  fsdp_min_size: int = 1024
  table: tuple[tuple[str, MeshAxes], ...] = ()

  def __post_init__(self):
    expect(self.fsdp_min_size >= 1, 'rules.fsdp_min_size', '>= 1', self.fsdp_min_size,
           ConfigError)
    for entry in self.table:
      expect(isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str),
             'rules.table entry', '(logical_name, mesh_axes)', repr(entry), ConfigError)

  @property
  def uses_logical(self) -> bool:
    """Whether the rules need the state's logical axis names (tensor parallel)."""
    return bool(self.table)

  def check(self, mesh: Mesh) -> None:
    """Checks that every mesh axis the rules name exists in ``mesh``.

    Raises:
      ConfigError: naming the rule, the mesh's axes and the unknown axis.
    """
    names = tuple(mesh.axis_names)
    for axis in self.batch_axes:
      expect(axis in names, 'rules.batch_axes', f'mesh axes among {names}', repr(axis),
             ConfigError)
    if self.fsdp_axis is not None:
      expect(self.fsdp_axis in names, 'rules.fsdp_axis', f'a mesh axis among {names}',
             repr(self.fsdp_axis), ConfigError)
    for logical, axes in self.table:
      for axis in _as_tuple(axes):
        expect(axis in names, f'rules.table[{logical!r}]',
               f'mesh axes among {names} (or None)', repr(axis), ConfigError)

  def mesh_axes(self, logical: str | None) -> tuple[str, ...]:
    """The mesh axes a logical axis name maps to (``()``: replicated)."""
    for name, axes in self.table:
      if name == logical:
        return _as_tuple(axes)
    return ()


def _as_tuple(axes: MeshAxes) -> tuple[str, ...]:
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def data_parallel() -> Rules:
  """Params replicated, batch split over ``('data', 'fsdp')``."""
  return Rules()


def fsdp(min_size: int = 1024) -> Rules:
  """Params and optimizer state of ``>= min_size`` elements split over ``'fsdp'``.

  Smaller arrays (biases, norms' scales, a small model's whole weights) stay
  replicated on every device: splitting them saves less memory than their
  all-gathers cost. So a small model may come out mostly unsharded;
  :func:`purax.summary` shows which arrays were split (a ``PartitionSpec``
  naming ``'fsdp'``) and which stayed whole (``PartitionSpec()``), and the
  bytes each takes per device.

  Example: of a small MLP's four arrays, only the first kernel is split:

    >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
    ...                   tx=optax.sgd(0.1))
    >>> mesh = purax.parallel.make_mesh(data=4, fsdp=2)
    >>> plan = purax.parallel.sharded(task, mesh, purax.parallel.fsdp(), batch)
    >>> for p in purax.summary(task, batch, plan).params:
    ...   print(p.path, p.shape, p.spec)
    Dense_0/bias (32,) P()
    Dense_0/kernel (64, 32) P('fsdp', None)
    Dense_1/bias (10,) P()
    Dense_1/kernel (32, 10) P()

  Args:
    min_size: the fewest elements an array needs to be split (default 1024;
      1 splits every array with a dimension the ``'fsdp'`` axis size divides;
      each is split along its largest such dimension).

  Returns:
    The :class:`Rules`.
  """
  return Rules(fsdp_axis='fsdp', fsdp_min_size=min_size)


def tensor_parallel(table: Sequence[tuple[str, MeshAxes]] | Mapping[str, MeshAxes] = DEFAULT_TABLE,
                    *, fsdp_min_size: int | None = None) -> Rules:
  """Params split by their logical axis names through ``table``.

  Args:
    table: ``{logical_name: mesh_axes}`` or pairs; default :data:`DEFAULT_TABLE`.
    fsdp_min_size: also split large arrays over ``'fsdp'`` (None: no FSDP).
  """
  pairs = tuple(table.items()) if isinstance(table, Mapping) else tuple(table)
  if fsdp_min_size is None:
    return Rules(table=pairs)
  return Rules(table=pairs, fsdp_axis='fsdp', fsdp_min_size=fsdp_min_size)


def for_mesh(mesh: Mesh, *, fsdp_min_size: int = 1024) -> Rules:
  """The strategy a mesh's shape implies (the CLI's ``--mesh``).

  ``tensor > 1``: tensor parallel (plus FSDP when ``fsdp > 1``); else
  ``fsdp > 1``: FSDP; else data parallel.
  """
  shape = dict(mesh.shape)
  use_fsdp = shape.get('fsdp', 1) > 1
  if shape.get('tensor', 1) > 1:
    return tensor_parallel(fsdp_min_size=fsdp_min_size if use_fsdp else None)
  return fsdp(fsdp_min_size) if use_fsdp else data_parallel()


def batch_spec(shape: Sequence[int], mesh: Mesh, rules: Rules, *, field: str = 'batch') -> P:
  """The spec of one batch array ``[batch, ...]``: leading axis over ``batch_axes``.

  Raises:
    DataError: the leading dimension is not a multiple of the batch axes' size.
  """
  axes = tuple(a for a in rules.batch_axes if mesh.shape[a] > 1)
  size = math.prod(mesh.shape[a] for a in axes)
  expect(len(shape) >= 1, f'{field}.shape', '[batch, ...]', tuple(shape))
  split = ' x '.join(f'{a}={mesh.shape[a]}' for a in rules.batch_axes)
  expect(shape[0] % size == 0, f'{field}.shape[0] (global batch size)',
         f'a multiple of {size} (the mesh splits the batch over {split})', shape[0])
  if not axes:
    return P()
  return P(axes if len(axes) > 1 else axes[0], *([None] * (len(shape) - 1)))


def array_spec(shape: Sequence[int], logical: P | None, mesh: Mesh, rules: Rules, *,
               path: str = 'array') -> P:
  """The spec of one parameter / optimizer-state array.

  Tensor-parallel dimensions come from ``logical`` through ``rules.table``;
  then, under FSDP, an array of ``>= fsdp_min_size`` elements has its largest
  remaining dimension divisible by the ``fsdp`` axis size split over it.

  Args:
    shape: the array's shape.
    logical: its logical names (``PartitionSpec('embed', 'mlp')``) or None.
    path: the array's path, for error messages.

  Raises:
    ConfigError: the logical spec's rank is not the array's; a dimension not
      divisible by the mesh axes it maps to; a mesh axis used twice.
  """
  dims: list[tuple[str, ...]] = [()] * len(shape)
  if logical is not None and len(logical) and rules.uses_logical:
    expect(len(logical) == len(shape), f'{path} logical axes',
           f'one name per dimension of shape {tuple(shape)}', tuple(logical), ConfigError)
    used: set[str] = set()
    for i, name in enumerate(logical):
      axes = tuple(a for a in rules.mesh_axes(name) if mesh.shape[a] > 1)
      if not axes:
        continue
      size = math.prod(mesh.shape[a] for a in axes)
      expect(shape[i] % size == 0, f'{path}.shape[{i}] ({name!r})',
             f'a multiple of {size} (mesh axes {axes})', shape[i], ConfigError)
      expect(not used & set(axes), f'{path} logical axes {tuple(logical)}',
             'each mesh axis used by at most one dimension', f'{axes} reused', ConfigError)
      used |= set(axes)
      dims[i] = axes
  axis = rules.fsdp_axis
  if (axis is not None and mesh.shape[axis] > 1 and math.prod(shape) >= rules.fsdp_min_size
      and not any(axis in d for d in dims)):
    n = mesh.shape[axis]
    free = [i for i in range(len(shape)) if not dims[i] and shape[i] % n == 0]
    if free:
      i = max(free, key=lambda j: (shape[j], -j))
      dims[i] = (axis,)
  if not any(dims):
    return P()
  return P(*(None if not d else d[0] if len(d) == 1 else d for d in dims))
