"""Which leaves :func:`purax.core.optimizers.muon` orthogonalises, and along which axes.

Muon (Jordan 2024) orthogonalises the momentum of the *matrices* of the
network's hidden layers; its references keep the embeddings, the output head
and the vectors (norm scales and offsets, biases) on AdamW (Jordan, "Muon: An
optimizer for hidden layers in neural networks", 2024: "the input embedding,
final output layer, and any internal gains or biases should be optimized
using a standard method such as AdamW"; modded-nanogpt; Liu et al. 2025,
"Muon is Scalable for LLM Training"). A matrix in the math need not be a 2-D
leaf: optax's :class:`optax.contrib.MuonDimensionNumbers` name its reduction
(input) and output axes, every other axis is a batch axis (each slice
orthogonalised on its own). :func:`muon_leaves` is the rule, one row per
leaf; it is what ``purax train --optimizer muon --dry-run`` prints.

The rule, on a leaf's path (its keys joined by ``/``) and shape; under a
``'layers'`` dict key (:func:`purax.nn.transformer.stack` stacked by
``nn.scan``, ``[layers, ...]``) the leading axis is a batch axis, so that a
scanned stack gets the update of the unrolled one, layer by layer:

- fewer than 2 axes (besides the stacked one): AdamW (a bias, a norm's scale
  or offset, a scalar);
- named ``embedding`` (``nn.Embed``'s table; the DecoderLM's tied output head
  too) or ``pos_embedding``: AdamW (a lookup table);
- the output head: a leaf named ``head`` or under a module ``head`` /
  ``lm_head``, or the kernel of the last top-level ``Dense_N`` (flax's
  automatic names: the MLP's, CNN's and ResNet's classifier): AdamW. A head
  of another name (an NNX or Equinox model's last layer, ``b/kernel``) is a
  matrix to the rule: the table shows it, ``muon_leaves={'b/kernel': None}``
  moves it;
- attention (:class:`purax.nn.attention.SelfAttention`, ``'bsd,dkhf->kbshf'``
  and ``'bshf,hfd->bsd'``): ``qkv`` ``[embed, 3, heads, head_dim]``:
  reduction ``embed``, output ``(heads, head_dim)``, the ``3`` a batch axis
  (the query, key and value projections are three matrices, as
  modded-nanogpt's ``qkvo_w`` ``[4, d, d]`` is batched);
  ``out`` ``[heads, head_dim, embed]``: reduction ``(heads, head_dim)``,
  output ``embed``;
- ``kernel`` (flax ``[in, out]``; a convolution ``[*window, in, out]``):
  output the last axis, reduction every other (a convolution as the matrix
  ``[in * prod(window), out]``, the transpose of the references' ``[out,
  in*k*k]``: Newton-Schulz commutes with the transpose);
- ``weight`` (Equinox and PyTorch, ``[out, in, *window]``): output the first
  axis, reduction the others;
- any other 2-D leaf: a matrix ``[in, out]`` (optax's default);
- anything else: AdamW (an unknown layout of more than 2 axes: name its axes
  with ``muon_leaves=``).

Override: ``muon(muon_leaves={regex: MuonDimensionNumbers(...) or None})``,
the first pattern that fully matches a leaf's path decides it (None: AdamW),
the rule decides the others; a pattern that matches no leaf is an error.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, NamedTuple

import jax
import optax
from optax.contrib import MuonDimensionNumbers

from purax.core.errors import ConfigError, expect

#: Leaf names of lookup tables (AdamW).
EMBEDDINGS = ('embedding', 'pos_embedding')
#: Leaf or module names of an output head (AdamW).
HEADS = ('head', 'lm_head')


class MuonLeaf(NamedTuple):
  """A row of :func:`muon_leaves`.

  Attributes:
    path: the leaf's keys joined by ``/`` (``layers_0/attention/qkv``).
    shape: its shape.
    part: ``'muon'`` or ``'adamw'``.
    reduction, output: the matrix's input and output axes (non-negative;
      ``()`` for AdamW); batch: the other axes (each slice its own matrix).
    why: the rule that decided it, in words.
  """

  path: str
  shape: tuple[int, ...]
  part: str
  reduction: tuple[int, ...]
  output: tuple[int, ...]
  batch: tuple[int, ...]
  why: str

  @property
  def dimension_numbers(self) -> optax.contrib.MuonDimensionNumbers | None:
    """optax's spec of this leaf (None: AdamW)."""
    if self.part != 'muon':
      return None
    return MuonDimensionNumbers(self.reduction, self.output)


def _name(key) -> str:
  for attr in ('key', 'name', 'idx'):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _stacked(path) -> bool:
  # As purax.core.optim.matrices: a 'layers' dict key (nn.scan's stack).
  return any(getattr(k, 'key', None) == 'layers' for k in path)


def _is_boxed(x) -> bool:
  return hasattr(x, 'unbox') and hasattr(x, 'value')


def _unboxed(x):
  return x.value if _is_boxed(x) else x


def _is_masked(x) -> bool:
  return isinstance(x, optax.MaskedNode)


def check_overrides(overrides) -> tuple[tuple[str, Any], ...]:
  """``muon_leaves=`` as a hashable tuple of ``(pattern, dims or None)``.

  Raises:
    ConfigError: not a mapping of regular expressions to
      ``MuonDimensionNumbers`` or None, naming the entry.
  """
  if overrides is None:
    return ()
  expect(isinstance(overrides, Mapping), 'muon_leaves',
         'None or a mapping {regex of a leaf path: optax.contrib.MuonDimensionNumbers or '
         'None (AdamW)}', f'{type(overrides).__name__} {overrides!r:.60}', ConfigError)
  out = []
  for pattern, dims in overrides.items():
    field = f'muon_leaves[{pattern!r}]'
    expect(isinstance(pattern, str), field, 'a regular expression (str) of a leaf path',
           type(pattern).__name__, ConfigError)
    try:
      re.compile(pattern)
    except re.error as e:
      raise ConfigError(f'{field}: expected a regular expression, got one that does not '
                        f'compile ({e})') from None
    expect(dims is None or isinstance(dims, MuonDimensionNumbers), field,
           'optax.contrib.MuonDimensionNumbers(reduction_axis, output_axis) or None (AdamW)',
           f'{type(dims).__name__} {dims!r:.60}', ConfigError)
    if dims is not None:
      as_tuple = lambda a: (a,) if isinstance(a, int) else tuple(a)  # noqa: E731
      dims = MuonDimensionNumbers(as_tuple(dims.reduction_axis), as_tuple(dims.output_axis))
    out.append((pattern, dims))
  return tuple(out)


def _adamw(path, shape, why):
  return MuonLeaf(path, shape, 'adamw', (), (), (), why)


def _muon(path, shape, reduction, output, why):
  ndim = len(shape)
  reduction = tuple(sorted(a % ndim for a in reduction))
  output = tuple(sorted(a % ndim for a in output))
  batch = tuple(a for a in range(ndim) if a not in reduction and a not in output)
  return MuonLeaf(path, shape, 'muon', reduction, output, batch, why)


def _overridden(text, shape, dims, pattern) -> MuonLeaf:
  field = f'muon_leaves[{pattern!r}]'
  if dims is None:
    return _adamw(text, shape, f'muon_leaves: {pattern!r}')
  axes = (*dims.reduction_axis, *dims.output_axis)
  ndim = len(shape)
  expect(ndim >= 2 and all(-ndim <= a < ndim for a in axes), field,
         f'axes of {text} (shape {list(shape)})', f'{dims}', ConfigError)
  norm = [a % ndim for a in axes]
  expect(len(set(norm)) == len(norm) and dims.reduction_axis and dims.output_axis, field,
         'disjoint, non-empty reduction and output axes', f'{dims}', ConfigError)
  return _muon(text, shape, dims.reduction_axis, dims.output_axis, f'muon_leaves: {pattern!r}')


def _rule(path, text, shape, last_dense) -> MuonLeaf:
  names = [_name(k) for k in path]
  leaf = names[-1] if names else ''
  lead = 1 if _stacked(path) else 0
  ndim = len(shape)
  stack_note = ', the stacked layer axis a batch axis' if lead else ''
  if ndim - lead < 2:
    return _adamw(text, shape, 'a vector or scalar (bias, norm scale or offset)')
  if 'bias' in leaf:
    return _adamw(text, shape, 'a bias')
  if leaf in EMBEDDINGS:
    return _adamw(text, shape, 'an embedding table (a lookup; Muon\'s references keep it '
                               'on AdamW)')
  if leaf in HEADS or any(n in HEADS for n in names[:-1]) or (
      len(names) == 2 and names[0] == last_dense and leaf == 'kernel'):
    return _adamw(text, shape, 'the output head (Muon\'s references keep it on AdamW)')
  if leaf == 'qkv' and ndim - lead == 4:
    return _muon(text, shape, (lead,), (lead + 2, lead + 3),
                 f'attention q, k, v: [embed] -> [heads, head_dim] each (axis {lead + 1} '
                 f'a batch axis{stack_note})')
  if leaf == 'out' and ndim - lead == 3:
    return _muon(text, shape, (lead, lead + 1), (lead + 2,),
                 f'attention output: [heads, head_dim] -> [embed]{stack_note}')
  if leaf == 'kernel':
    what = 'dense [in, out]' if ndim - lead == 2 else 'convolution [*window, in, out]'
    return _muon(text, shape, tuple(range(lead, ndim - 1)), (ndim - 1,),
                 f'{what}{stack_note}')
  if leaf == 'weight':
    return _muon(text, shape, tuple(range(lead + 1, ndim)), (lead,),
                 f'[out, in, *window] (Equinox/PyTorch){stack_note}')
  if ndim - lead == 2:
    return _muon(text, shape, (lead,), (lead + 1,), f'a matrix [in, out]{stack_note}')
  return _adamw(text, shape, f'{ndim} axes of an unknown layout (name them in muon_leaves=)')


def _last_dense(texts) -> str | None:
  numbers = [int(m.group(1)) for t in texts
             if (m := re.fullmatch(r'Dense_(\d+)/kernel', t))]
  return f'Dense_{max(numbers)}' if numbers else None


def _rows(params, overrides) -> list[tuple[Any, MuonLeaf | None]]:
  # overrides: a mapping, or check_overrides' tuple (the optimizer's static form).
  overrides = check_overrides(dict(overrides) if isinstance(overrides, tuple) else overrides)
  params = jax.tree.map(_unboxed, params, is_leaf=_is_boxed)   # flax's nn.Partitioned
  flat = jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_masked)
  texts = ['/'.join(_name(k) for k in path) for path, _ in flat]
  last_dense = _last_dense(texts)
  used = set()
  out = []
  for (path, x), text in zip(flat, texts):
    if _is_masked(x):
      shape = None
    else:
      shape = tuple(int(d) for d in getattr(x, 'shape', ()))
    row = None
    for pattern, dims in overrides:
      if re.fullmatch(pattern, text):
        used.add(pattern)
        row = None if shape is None else _overridden(text, shape, dims, pattern)
        break
    else:
      row = None if shape is None else _rule(path, text, shape, last_dense)
    out.append((x, row))
  unused = [p for p, _ in overrides if p not in used]
  expect(not unused, 'muon_leaves', 'patterns that each match a leaf path (e.g. '
         f'{texts[0]!r})' if texts else 'patterns that each match a leaf path',
         f'{unused} matching none', ConfigError)
  return out


def muon_leaves(params, muon_leaves: Mapping[str, optax.contrib.MuonDimensionNumbers | None]
                | None = None) -> list[MuonLeaf]:
  """The table of which leaf :func:`purax.core.optimizers.muon` gives to Muon
  (and along which axes) and which to AdamW, and why (the rule: this module's
  docstring).

  Args:
    params: a params pytree (arrays or ``jax.ShapeDtypeStruct``: only shapes
      are read), e.g. ``state.params`` or ``jax.eval_shape``'s.
    muon_leaves: overrides, as the optimizer's ``muon_leaves=``: ``{regex:
      optax.contrib.MuonDimensionNumbers or None}``, the first pattern that
      fully matches a leaf path decides it (None: AdamW).

  Returns:
    One :class:`MuonLeaf` per leaf, in ``jax.tree.leaves`` order.

  Raises:
    ConfigError: a bad override, or a pattern that matches no leaf, named.

  Example: ``[r.path for r in muon_leaves(state.params) if r.part == 'muon']``.
  """
  return [row for _, row in _rows(params, muon_leaves)]


def dimension_numbers(params, muon_leaves=None):
  """The tree optax's Muon takes (``weight_dimension_numbers``): per leaf its
  :class:`optax.contrib.MuonDimensionNumbers`, None for AdamW; a masked leaf
  (``optax.MaskedNode``, within ``optax.partition``) stays masked. The rule
  sees every path, masked or not, so the same leaf gets the same answer
  inside and outside a partition."""
  rows = _rows(params, muon_leaves)
  values = [x if row is None else row.dimension_numbers for x, row in rows]
  treedef = jax.tree.structure(params, is_leaf=_is_masked)
  return jax.tree.unflatten(treedef, values)


def labels(params, muon_leaves=None):
  """``'muon'`` or ``'adamw'`` per leaf (``optax.partition``'s labels); a
  masked leaf stays masked."""
  rows = _rows(params, muon_leaves)
  treedef = jax.tree.structure(params, is_leaf=_is_masked)
  return jax.tree.unflatten(treedef, [x if row is None else row.part for x, row in rows])


def width_scale(update, dims: optax.contrib.MuonDimensionNumbers):
  """Jordan's width scaling of an orthogonalised update, ``sqrt(max(1,
  fan_out / fan_in))`` (as optax.contrib.muon's ``scale_by_shape``)."""
  shape = update.shape
  fan_in = math.prod(shape[a] for a in dims.reduction_axis)
  fan_out = math.prod(shape[a] for a in dims.output_axis)
  return update * math.sqrt(max(1.0, fan_out / fan_in))


def format_muon_leaves(rows: list[MuonLeaf]) -> str:
  """The table as text: a line per leaf (path, shape, part, axes, why) and a count."""
  cells = [(r.path, '[' + ', '.join(map(str, r.shape)) + ']', r.part,
            f'red {list(r.reduction)} out {list(r.output)} batch {list(r.batch)}'
            if r.part == 'muon' else '-', r.why) for r in rows]
  head = ('leaf', 'shape', 'part', 'axes', 'why')
  widths = [max(len(c[i]) for c in [head, *cells]) for i in range(4)]
  lines = ['  '.join(c[i].ljust(widths[i]) for i in range(4)) + '  ' + c[4]
           for c in [head, *cells]]
  n = sum(r.part == 'muon' for r in rows)
  size = lambda part: sum(math.prod(r.shape) for r in rows if r.part == part)  # noqa: E731
  lines.append(f'muon: {n} leaves, {size("muon"):,} parameters; adamw: {len(rows) - n} '
               f'leaves, {size("adamw"):,} parameters')
  return '\n'.join(lines)


def leaf_table(params, overrides=None) -> str:
  """:func:`format_muon_leaves` of :func:`muon_leaves` (what ``purax train
  --optimizer muon --dry-run`` prints)."""
  return format_muon_leaves(muon_leaves(params, overrides))
