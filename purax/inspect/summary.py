"""Model summaries from shapes alone: parameters per module, each parameter's
shape, dtype and sharding, state bytes per device.

Everything here reads shapes, dtypes and shardings, never values, so it works
on an abstract state (``jax.eval_shape(task.init, key, batch)``, whose leaves
are ``jax.ShapeDtypeStruct``, optionally with a ``sharding``) as well as on a
real one, and costs nothing on the device. :func:`summary` (``purax.summary``)
is the one call, like ``nnx.tabulate`` with the sharding: on a plan's mesh
each parameter's PartitionSpec and bytes per device.

Example:
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
  >>> from purax.inspect import summary
  >>> abstract = jax.eval_shape(task.init, jax.random.key(0), batch)
  >>> print(summary.format_summary(summary.summarize(abstract)))
  module     parameters       bytes
  Dense_0         2,080    8.12 KiB
  Dense_1           330    1.29 KiB
  total           2,410
  state per device: 28.29 KiB (step 4 B, params 9.41 KiB, opt_state 18.86 KiB, rng 8 B, hparams 4 B)

:func:`compiled_cost` reads XLA's cost and memory analysis of a compiled step
(``jax.jit(f).lower(*args).compile()``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Param:
  """One parameter array of a :class:`Summary`.

  Attributes:
    path: its path in the params tree, ``'Dense_0/kernel'``.
    shape: its global shape.
    dtype: its dtype name, ``'float32'``.
    spec: its ``jax.sharding.PartitionSpec`` (``PartitionSpec()``: replicated
      on every device of the mesh), or None without a mesh (one device).
    bytes_per_device: the bytes of it on the device holding the largest
      piece (the whole array when replicated or on one device).
  """

  path: str
  shape: tuple[int, ...]
  dtype: str
  spec: Any
  bytes_per_device: int


@dataclasses.dataclass(frozen=True)
class Summary:
  """What :func:`summarize` finds; ``str()`` of it is :func:`format_summary`'s
  table with a row per parameter.

  Attributes:
    modules: ``(name, parameters, bytes)`` per top-level entry of the params
      tree (a flax module such as ``Conv_0``; scanned layers count once with
      their stacked ``[layers, ...]`` leaves), in the tree's order.
    total_params: the sum of ``modules``' parameters.
    bytes_per_device: for each part of the state (``params``, ``opt_state``,
      ``model_state``, ..., and ``total``), the bytes the most loaded device
      holds: a leaf with a sharding counts its shard, one without counts whole
      (it lives on one device).
    params: a :class:`Param` per parameter array, in the tree's order.
  """

  modules: tuple[tuple[str, int, int], ...]
  total_params: int
  bytes_per_device: Mapping[str, int]
  params: tuple[Param, ...] = ()

  def __str__(self) -> str:
    return format_summary(self, per_parameter=True)


def _size(leaf) -> int:
  return math.prod(np.shape(leaf))


def _nbytes(leaf) -> int:
  dtype = getattr(leaf, 'dtype', None)
  if dtype is None or jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    # a typed key: its key data, e.g. 2 x uint32 for threefry
    data = jax.eval_shape(jax.random.key_data, leaf) if dtype is not None else None
    return 0 if data is None else _size(data) * np.dtype(data.dtype).itemsize
  return _size(leaf) * np.dtype(dtype).itemsize


def _shard_bytes(leaf) -> int:
  """Bytes of ``leaf`` on the device holding the largest piece of it."""
  sharding = getattr(leaf, 'sharding', None)
  total = _nbytes(leaf)
  if sharding is None or not np.shape(leaf):
    return total
  shard = sharding.shard_shape(np.shape(leaf))
  return total * math.prod(shard) // max(_size(leaf), 1)


def param_counts(params: Any) -> list[tuple[str, int, int]]:
  """``(name, parameters, bytes)`` per top-level entry of ``params``.

  Args:
    params: any pytree of arrays or ``ShapeDtypeStruct``; a mapping (flax's
      ``{'Dense_0': {...}, ...}``) is split by key, any other tree by its
      first path element (one row named ``params`` for a single array).
  """
  rows: dict[str, list[int]] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    name = jax.tree_util.keystr(path[:1], simple=True, separator='/') if path else 'params'
    row = rows.setdefault(name or 'params', [0, 0])
    row[0] += _size(leaf)
    row[1] += _nbytes(leaf)
  return [(name, count, nbytes) for name, (count, nbytes) in rows.items()]


def param_rows(params: Any) -> tuple[Param, ...]:
  """A :class:`Param` per leaf of ``params`` (arrays or ``ShapeDtypeStruct``)."""
  rows = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    sharding = getattr(leaf, 'sharding', None)
    spec = getattr(sharding, 'spec', None) if sharding is not None else None
    if sharding is not None and spec is None and getattr(sharding, 'is_fully_replicated', False):
      spec = jax.sharding.PartitionSpec()
    if sharding is not None and len(getattr(sharding, 'device_set', ())) <= 1:
      spec = None                     # one device: nothing is split or copied
    rows.append(Param(jax.tree_util.keystr(path, simple=True, separator='/') or 'params',
                      tuple(np.shape(leaf)), str(getattr(leaf, 'dtype', '')), spec,
                      _shard_bytes(leaf)))
  return tuple(rows)


def tree_bytes_per_device(tree: Any) -> int:
  """Bytes of ``tree`` on its most loaded device (shards for sharded leaves)."""
  return sum(_shard_bytes(leaf) for leaf in jax.tree.leaves(tree))


def summarize(state: Any) -> Summary:
  """The :class:`Summary` of a TrainState (abstract or real), or of a params tree.

  Args:
    state: a :class:`purax.TrainState` (``params``, ``opt_state``,
      ``model_state``, ...), or any pytree taken as the parameters.
  """
  params = getattr(state, 'params', state)
  modules = tuple(param_counts(params))
  parts: dict[str, int] = {}
  if params is state:
    parts['params'] = tree_bytes_per_device(params)
  else:
    for field in dataclasses.fields(state):
      parts[field.name] = tree_bytes_per_device(getattr(state, field.name))
  parts['total'] = sum(parts.values())
  return Summary(modules=modules, total_params=sum(m[1] for m in modules),
                 bytes_per_device=parts, params=param_rows(params))


def with_shardings(state: Any, shardings: Any) -> Any:
  """``state``'s shapes and dtypes (``ShapeDtypeStruct`` leaves) carrying
  ``shardings`` (a tree of ``jax.sharding.Sharding`` like ``state``)."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s),
                      state, shardings)


def summary(task: Any, batch: Any, plan: Any = None) -> Summary:
  """The summary of ``task``'s state for ``batch``'s shapes, placed as ``plan`` places it.

  Per parameter: its path, shape, dtype, ``PartitionSpec`` and bytes per
  device; per module: parameters and bytes; per part of the state (params,
  optimizer state, ...): bytes on the most loaded device. Like
  ``nnx.tabulate``, with the sharding: a parameter left replicated by
  :func:`purax.parallel.fsdp`'s ``min_size`` shows ``PartitionSpec()`` and
  its whole size per device. From ``jax.eval_shape``: nothing is allocated
  or compiled.

  Example: FSDP over 2 of 8 devices, every array split (``min_size=1``):

    >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
    ...                   tx=optax.sgd(0.1))
    >>> mesh = purax.parallel.make_mesh(data=4, fsdp=2)
    >>> plan = purax.parallel.sharded(task, mesh, purax.parallel.fsdp(min_size=1), batch)
    >>> print(purax.summary(task, batch, plan))
    parameter       shape     dtype    PartitionSpec    per device
    Dense_0/bias    [32]      float32  P('fsdp')              64 B
    Dense_0/kernel  [64, 32]  float32  P('fsdp', None)    4.00 KiB
    Dense_1/bias    [10]      float32  P('fsdp')              20 B
    Dense_1/kernel  [32, 10]  float32  P('fsdp', None)       640 B
    <BLANKLINE>
    module     parameters       bytes
    Dense_0         2,080    8.12 KiB
    Dense_1           330    1.29 KiB
    total           2,410
    state per device: 4.72 KiB (step 4 B, params 4.71 KiB, rng 8 B, hparams 4 B)

  Args:
    task: a :class:`purax.Task`.
    batch: a sample batch (arrays or ``jax.ShapeDtypeStruct``; only shapes
      and dtypes matter).
    plan: None (one device), or a plan with ``state_sharding`` (a tree of
      shardings like the state: :func:`purax.parallel.sharded`).

  Returns:
    A :class:`Summary`; ``print`` it for the table.

  Raises:
    DataError: the batch does not suit the model (as :meth:`purax.Task.init`).
  """
  state = task.abstract_state(batch)
  shardings = getattr(plan, 'state_sharding', None)
  if shardings is not None:
    state = with_shardings(state, shardings)
  return summarize(state)


def human_bytes(n: float) -> str:
  """``1536`` -> ``'1.50 KiB'`` (binary units, as XLA and ``nvidia-smi`` count)."""
  for unit in ('B', 'KiB', 'MiB', 'GiB'):
    if abs(n) < 1024 or unit == 'GiB':
      return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.2f} {unit}'
    n /= 1024
  raise AssertionError('unreachable')


def _spec_text(spec) -> str:
  if spec is None:
    return '-'
  return 'P(' + ', '.join(repr(a) if not isinstance(a, tuple) else
                          '(' + ', '.join(map(repr, a)) + ')' for a in spec) + ')'


def format_params(params: tuple[Param, ...], *, max_rows: int = 200) -> str:
  """A table, one row per parameter: path, shape, dtype, PartitionSpec, bytes per device."""
  rows = [(p.path, '[' + ', '.join(map(str, p.shape)) + ']', p.dtype, _spec_text(p.spec),
           human_bytes(p.bytes_per_device)) for p in params[:max_rows]]
  head = ('parameter', 'shape', 'dtype', 'PartitionSpec', 'per device')
  widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
  fmt = lambda r: '  '.join(c.ljust(w) if i < 4 else c.rjust(w)   # noqa: E731
                            for i, (c, w) in enumerate(zip(r, widths)))
  lines = [fmt(head), *map(fmt, rows)]
  if len(params) > max_rows:
    lines.append(f'... {len(params) - max_rows} more')
  return '\n'.join(lines)


def format_summary(summary: Summary, *, max_rows: int = 30, per_parameter: bool = False) -> str:
  """A table: one row per module, the total, and the state bytes per device;
  with ``per_parameter``, first one row per parameter (:func:`format_params`)."""
  width = max([len('module'), *(len(m[0]) for m in summary.modules[:max_rows])])
  lines = [format_params(summary.params), ''] if per_parameter and summary.params else []
  lines.append(f"{'module':<{width}}  {'parameters':>12}  {'bytes':>10}")
  for name, count, nbytes in summary.modules[:max_rows]:
    lines.append(f'{name:<{width}}  {count:>12,}  {human_bytes(nbytes):>10}')
  if len(summary.modules) > max_rows:
    rest = summary.modules[max_rows:]
    lines.append(f"{f'... {len(rest)} more':<{width}}  {sum(m[1] for m in rest):>12,}")
  lines.append(f"{'total':<{width}}  {summary.total_params:>12,}")
  parts = ', '.join(f'{k} {human_bytes(v)}' for k, v in summary.bytes_per_device.items()
                    if k != 'total' and v)
  lines.append(f"state per device: {human_bytes(summary.bytes_per_device['total'])} ({parts})")
  return '\n'.join(lines)


def compiled_cost(compiled: Any) -> dict[str, float]:
  """FLOPs and memory of a compiled function, from XLA's own analyses.

  Args:
    compiled: ``jax.jit(f).lower(*args).compile()``.

  Returns:
    ``flops`` (XLA's count for one call; absent if the backend gives none),
    ``bytes_accessed`` (XLA's count of bytes read and written by the
    program's operations, when given), and bytes of memory:
    ``argument_bytes``, ``output_bytes``, ``alias_bytes`` (outputs reusing
    donated inputs), ``temp_bytes`` (scratch), ``code_bytes``, and
    ``peak_bytes`` = arguments + outputs - aliased + temporaries;
    ``loops``: 1.0 when the program has a while loop (``lax.scan``,
    ``nn.scan`` layers, gradient accumulation), whose body XLA's cost
    analysis counts once, not once per iteration, so ``flops`` and
    ``bytes_accessed`` are then lower bounds.
  """
  out: dict[str, float] = {}
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):   # older jax: one dict per computation
    cost = cost[0] if cost else None
  if cost and 'flops' in cost:
    out['flops'] = float(cost['flops'])
  if cost and 'bytes accessed' in cost:
    out['bytes_accessed'] = float(cost['bytes accessed'])
  memory = compiled.memory_analysis()
  if memory is not None:
    fields = {'argument_bytes': 'argument_size_in_bytes',
              'output_bytes': 'output_size_in_bytes', 'alias_bytes': 'alias_size_in_bytes',
              'temp_bytes': 'temp_size_in_bytes', 'code_bytes': 'generated_code_size_in_bytes'}
    for key, attr in fields.items():
      if hasattr(memory, attr):
        out[key] = float(getattr(memory, attr))
    out['peak_bytes'] = (out.get('argument_bytes', 0) + out.get('output_bytes', 0)
                         - out.get('alias_bytes', 0) + out.get('temp_bytes', 0))
  out['loops'] = float(' while(' in compiled.as_text())
  return out


def format_cost(cost: Mapping[str, float]) -> str:
  """One line: ``compiled step: 1.23 GFLOP, memory 45.6 MiB peak (...)``."""
  flops = f"{cost['flops'] / 1e9:.3g} GFLOP" if 'flops' in cost else 'FLOPs unknown'
  if cost.get('loops') and 'flops' in cost:
    flops += ' (XLA counts each loop body once: more with scanned layers or microbatches)'
  if 'peak_bytes' not in cost:
    return f'compiled step: {flops}'
  return (f"compiled step: {flops}, memory {human_bytes(cost['peak_bytes'])} peak "
          f"(arguments {human_bytes(cost.get('argument_bytes', 0))}, outputs "
          f"{human_bytes(cost.get('output_bytes', 0))}, aliased "
          f"{human_bytes(cost.get('alias_bytes', 0))}, temporaries "
          f"{human_bytes(cost.get('temp_bytes', 0))})")
