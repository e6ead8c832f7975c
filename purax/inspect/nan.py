"""Where a non-finite value came from: one update replayed outside the hot path.

:func:`find` re-runs the update of ``state`` on ``batch`` (the step's
dropout key, microbatches and loss scale, as :meth:`purax.Task.step` runs
it) in programs of its own and returns a :class:`Report` naming the first
non-finite value, searched in this order:

1. ``hyperparameter``: a NaN or inf learning rate (or any hyperparameter in
   the state, :func:`purax.core.hparams.get`);
2. ``forward``: the first module call (in the order calls return) whose output
   holds a NaN or inf, found by intercepting every module call
   (:mod:`purax.inspect.intercept`: linen, NNX, Equinox), with a callback per
   call (``jax.debug.callback``, so calls inside ``nn.scan``, ``vmap`` or
   ``remat`` are seen too). When that call's inputs were already non-finite,
   the value came from the code around it: the ``batch`` (when it holds a
   non-finite float), else the calling module's own code (named by its
   path). A model without modules (:class:`purax.Functions`) is seen whole;
3. ``loss``: the model's outputs are finite but the loss is not;
4. ``backward``: the forward pass and the loss are finite, and these
   parameters' gradients are not. The backward pass is replayed with every
   module call's inputs and outputs through an identity whose custom VJP
   counts the NaN and inf of the cotangent passing through (a callback), and
   the first cotangent made non-finite names the module: the one whose
   output cotangent is finite and input cotangent is not (its backward pass
   made it, e.g. a ``sqrt`` at 0 in its code), or the code that used a
   module's output (its caller; ``(the loss)`` for the model's outputs);
   inside a scanned layer, which layer (the backward pass runs the iterations
   last to first). Only a parameter's own use (``sqrt`` of a parameter)
   leaves every cotangent finite: then the first parameter whose gradient is
   not finite is named (every leaf, in tree order);
5. ``none``: the replay was finite (the state or batch given are not those of
   the non-finite update).

:class:`purax.hooks.NonFiniteReplay` calls it when ``fit`` skips an update as
non-finite, and ``purax debug-nan`` on an update saved by a run.

Example: a batch holding a NaN, replayed from the state before its update:

  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=optax.sgd(0.1))
  >>> state = task.init(jax.random.key(0), batch)
  >>> bad = {'x': batch['x'].copy(), 'y': batch['y']}
  >>> bad['x'][3, 0, 0, 0] = np.nan
  >>> report = purax.find_nonfinite(task, state, bad)
  >>> print(report)
  update at state.step=0: batch: batch['x']: holds 1 NaN and 0 inf of float32[64, 8, 8, 1] ...
  >>> report.where, report.path
  ('batch', "batch['x']")
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purax.core import hparams as hparams_lib
from purax.core import update
from purax.core.errors import expect_kind
from purax.inspect.intercept import intercept_calls
from purax.core.state import TrainState

PyTree = Any
#: The places :func:`find` names, in the order it searches them (module doc).
WHERE = ('hyperparameter', 'batch', 'forward', 'loss', 'backward', 'none')


@dataclasses.dataclass(frozen=True)
class Report:
  """Where the first non-finite value of an update came from (see the module docstring).

  Attributes:
    step: ``state.step`` of the update (the index of its batch).
    where: one of :data:`WHERE`.
    path: what holds it: a hyperparameter's name, ``batch['x']``, a module's
      path (``encoder/block``; ``(the model)`` for the model itself), the loss
      function's name, or the first parameter whose gradient is not finite
      (``['Dense_0']['kernel']``); ``''`` for ``none``.
    detail: one sentence: how many NaN and inf, of what shape.
    gradients: every parameter whose gradient holds a NaN or inf (tree order).
  """

  step: int
  where: str
  path: str
  detail: str
  gradients: tuple[str, ...] = ()

  def __str__(self) -> str:
    text = f'update at state.step={self.step}: {self.where}'
    text += f': {self.path}: {self.detail}' if self.path else f': {self.detail}'
    if self.gradients and self.where != 'backward':
      text += f' (non-finite gradients: {_listed(self.gradients)})'
    return text

  def as_dict(self) -> dict:
    """JSON-ready."""
    return {**dataclasses.asdict(self), 'gradients': list(self.gradients)}

  @classmethod
  def from_dict(cls, data: dict) -> 'Report':
    return cls(**{**data, 'gradients': tuple(data.get('gradients', ()))})


def _listed(paths) -> str:
  paths = list(paths)
  return ', '.join(paths[:5]) + (f' and {len(paths) - 5} more' if len(paths) > 5 else '')


def _floats(tree) -> list:
  return [x for x in jax.tree.leaves(tree)
          if hasattr(x, 'dtype') and jnp.issubdtype(x.dtype, jnp.inexact)]


def _counts(tree) -> tuple[jax.Array, jax.Array]:
  """``(NaN count, inf count)`` over the floating leaves of ``tree`` (traceable)."""
  leaves = _floats(tree)
  nan = sum((jnp.sum(jnp.isnan(x)) for x in leaves), jnp.zeros((), jnp.int32))
  inf = sum((jnp.sum(jnp.isinf(x)) for x in leaves), jnp.zeros((), jnp.int32))
  return nan, inf


def _shapes(tree) -> str:
  leaves = _floats(tree)
  return ', '.join(f'{x.dtype}{list(x.shape)}' for x in leaves[:3]) + (
      ' ...' if len(leaves) > 3 else '')


def _path(path: tuple) -> str:
  return '/'.join(map(str, path)) if path else '(the model)'


class _Calls:
  """The module calls of one traced forward pass: their order and shapes (at
  trace time) and the NaN / inf counts of their inputs and outputs (from a
  callback at run time, summed over scan iterations and vmapped examples)."""

  def __init__(self):
    self.calls: list[tuple[tuple, str, str]] = []
    self.seen: dict[int, list[np.ndarray]] = {}

  def hook(self, path, method, call, args, kwargs):
    out = call(*args, **kwargs)
    index = len(self.calls)          # calls are numbered as they return
    self.calls.append((tuple(path), method, _shapes(out)))
    counts = jnp.stack([*_counts((args, kwargs)), *_counts(out)])
    jax.debug.callback(functools.partial(self._record, index), counts)
    return out

  def _record(self, index, counts):
    self.seen.setdefault(index, []).extend(np.asarray(counts, np.int64).reshape(-1, 4))

  def first_nonfinite(self):
    """``(path, method, shapes, counts, run, runs)`` of the first call with a
    non-finite output: ``counts`` summed over its runs (a scanned layer's
    iterations, a vmapped module's examples), ``run`` the first (from 1) whose
    output is not finite, of ``runs``."""
    for index in sorted(self.seen):
      runs = self.seen[index]
      bad = [i for i, c in enumerate(runs) if c[2] + c[3]]
      if bad:
        return (*self.calls[index], np.sum(runs, axis=0), bad[0] + 1, len(runs))
    return None


class _Cotangents:
  """The module calls of one traced backward pass: each call's inputs and
  outputs go through an identity with a custom VJP whose backward rule counts
  the NaN and inf of the cotangent it passes on (a callback, at run time), so the
  cotangent at each module's output and at its inputs is seen in the order
  the backward pass makes them (:meth:`first_nonfinite`). Only this replay
  installs it: the step's own program is traced without it."""

  def __init__(self):
    self.events: list[tuple[tuple, str, str]] = []   # (path, method, 'in' | 'out'), forward order
    self.arrivals: list[tuple[int, np.ndarray]] = []  # (event, [NaN, inf]), run-time order

  def hook(self, path, method, call, args, kwargs):
    entry = len(self.events)
    self.events.append((tuple(path), method, 'in'))
    args, kwargs = self._watch((args, kwargs), entry)
    out = call(*args, **kwargs)
    exit_ = len(self.events)
    self.events.append((tuple(path), method, 'out'))
    return self._watch(out, exit_)

  def _watch(self, tree, index):
    """``tree`` with its floating arrays through the counting identity."""
    leaves, treedef = jax.tree.flatten(tree)
    picked = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)
              and jnp.issubdtype(x.dtype, jnp.inexact)]
    if not picked:
      return tree
    record = functools.partial(self._record, index)

    @jax.custom_vjp
    def identity(xs):
      return xs

    def backward(_, cotangents):
      # A pure callback whose (zero) answer the cotangents wait for: the
      # callbacks arrive in the order the backward pass makes the cotangents,
      # and a vmapped module's examples come in one call ('expand_dims').
      counts = jnp.stack(_counts(cotangents))
      zero = jax.pure_callback(record, jax.ShapeDtypeStruct((), jnp.int32), counts,
                               vmap_method='expand_dims')
      return (jax.tree.map(lambda c: jnp.where(zero == 0, c, jnp.nan), cotangents),)

    identity.defvjp(lambda xs: (xs, None), backward)
    watched = identity([leaves[i] for i in picked])
    for i, x in zip(picked, watched):
      leaves[i] = x
    return jax.tree.unflatten(treedef, leaves)

  def _record(self, index, counts):
    counts = np.asarray(counts, np.int64)
    self.arrivals.append((index, counts.reshape(-1, 2).sum(axis=0)))
    return np.zeros(counts.shape[:-1], np.int32)

  def first_nonfinite(self):
    """``(path, method, kind, counts, run, runs)`` of the first cotangent the
    backward pass made non-finite, in the order the callbacks arrived (the
    order the backward pass ran): ``kind`` ``'in'`` (the module's backward
    pass made it from a finite output cotangent) or ``'out'`` (the code that
    used the module's output did); ``run`` its run (from 1, in the order the
    backward pass ran them: a scanned layer's iterations last to first) of
    ``runs``; ``counts`` that run's NaN and inf."""
    runs: dict[int, int] = {}
    first = None
    for index, counts in self.arrivals:
      runs[index] = runs.get(index, 0) + 1
      if first is None and counts.sum():
        first = (index, counts, runs[index])
    if first is None:
      return None
    index, counts, run = first
    return (*self.events[index], counts, run, runs[index])


def _backward(task, state, microbatch, key) -> tuple | None:
  """:meth:`_Cotangents.first_nonfinite` of one microbatch's backward pass
  (the loss scaled as the step scales it)."""
  cotangents = _Cotangents()
  scale = state.guards.get('loss_scale')

  def objective(params):
    with intercept_calls(cotangents.hook):
      loss, _ = task.compute_loss(params, state.model_state, microbatch, key,
                                  hparams=state.hparams, train=True)
    return loss if scale is None else scale.scale_loss(loss)

  jax.block_until_ready(jax.jit(jax.grad(objective))(state.params))
  jax.effects_barrier()
  return cotangents.first_nonfinite()


def _backward_report(step, found, gradients) -> Report:
  path, method, kind, counts, run, runs = found
  called = '' if method == '__call__' else f'.{method}'
  where = (f' (first in run {run} of its {runs} in the backward pass: in a scanned stack, '
           f'whose iterations the backward pass runs last to first, layer {runs - run} of '
           f'0..{runs - 1})' if runs > 1 else '')
  cotangent = f'holds {counts[0]} NaN and {counts[1]} inf{where}'
  tail = f' (non-finite gradients: {_listed(gradients)})'
  if kind == 'in':
    return Report(step, 'backward', _path(path) + called,
                  f"its backward pass: the cotangent of its output is finite, that of its "
                  f'inputs {cotangent}; the forward pass and the loss are finite{tail}',
                  gradients)
  if path:
    return Report(step, 'backward', _path(path[:-1]),
                  f'the backward pass of this module\'s own code, after it called '
                  f'{_path(path)}{called}: the cotangent of that call\'s output {cotangent}; '
                  f'the forward pass and the loss are finite{tail}', gradients)
  return Report(step, 'backward', '(the loss)',
                f"the loss's backward pass: the cotangent of the model's outputs {cotangent}; "
                f'the forward pass and the loss are finite{tail}', gradients)


def _microbatches(task, state, batch):
  """``(microbatch, key)`` of each microbatch, as the step splits the batch."""
  key = state.step_key()
  if task.microbatches == 1:
    return [(batch, key)]
  split = update._split(batch, task.microbatches)   # pylint: disable=protected-access
  return [(jax.tree.map(lambda a, i=i: a[i], split), jax.random.fold_in(key, i))
          for i in range(task.microbatches)]


def find(task, state: TrainState, batch: PyTree) -> Report:
  """Replays the update of ``state`` on ``batch`` and names its first
  non-finite value (see the module docstring).

  Args:
    task: the :class:`purax.Task` whose step was taken.
    state: the state *before* the update (``state.step`` is the update's
      step; its dropout key is ``fold_in(state.rng, state.step)``).
    batch: the update's batch.

  Returns:
    A :class:`Report`.

  Raises:
    ConfigError: ``state`` is not a :class:`purax.TrainState`.
  """
  expect_kind(state, 'state', TrainState, 'a purax.TrainState (one member, not a Population)')
  step = int(jax.device_get(state.step))
  values = jax.device_get(hparams_lib.get(state))
  bad = [name for name, v in values.items() if not np.all(np.isfinite(v))]
  # The gradients first: a forward pass that is finite may still have them non-finite.
  grads, _, _ = jax.jit(task.gradients)(state, batch)
  flat = jax.tree_util.tree_flatten_with_path(jax.device_get(grads))[0]
  gradients = tuple(jax.tree_util.keystr(p) for p, g in flat if not np.all(np.isfinite(g)))
  if bad:
    return Report(step, 'hyperparameter', bad[0], f'{values[bad[0]]!r} (non-finite '
                  f'hyperparameters: {_listed(bad)}): every update it enters is spoilt',
                  gradients)
  batch_bad = [(jax.tree_util.keystr(p), x) for p, x in
               jax.tree_util.tree_flatten_with_path(jax.device_get(batch))[0]
               if np.issubdtype(np.asarray(x).dtype, np.inexact)
               and not np.all(np.isfinite(x))]
  for microbatch, key in _microbatches(task, state, batch):
    calls = _Calls()

    def forward(state, microbatch, key, calls=calls):
      with intercept_calls(calls.hook):
        loss, aux = task.compute_loss(state.params, state.model_state, microbatch, key,
                                      hparams=state.hparams, train=True)
      return loss, _counts(aux['outputs'])

    loss, (nan, inf) = jax.jit(forward)(state, microbatch, key)
    jax.effects_barrier()
    first = calls.first_nonfinite()
    outputs_bad = int(nan) + int(inf) > 0
    if first is None and not outputs_bad and np.isfinite(float(loss)):
      continue
    if batch_bad and (first is None or first[3][0] + first[3][1] > 0):
      name, x = batch_bad[0]
      return Report(step, 'batch', f'batch{name}', f'holds {int(np.sum(np.isnan(x)))} NaN and '
                    f'{int(np.sum(np.isinf(x)))} inf of {x.dtype}{list(np.shape(x))}', gradients)
    if first is not None:
      path, method, shapes, counts, run, runs = first
      called = '' if method == '__call__' else f'.{method}'
      where = (f' (first in run {run} of its {runs}: the iterations of a scanned layer or '
               'the examples of a vmapped one)' if runs > 1 else '')
      if counts[0] + counts[1]:    # its inputs were not finite: the code that called it
        return Report(step, 'forward', _path(path[:-1]) if path else '(the model)',
                      f'the code of this module, before it called {_path(path)}{called}: '
                      f'that call\'s inputs hold {counts[0]} NaN and {counts[1]} inf{where}',
                      gradients)
      return Report(step, 'forward', _path(path) + called,
                    f'its output ({shapes}) holds {counts[2]} NaN and {counts[3]} inf, from '
                    f'finite inputs{where}', gradients)
    if outputs_bad:
      return Report(step, 'forward', '(the model)', f'its outputs hold {int(nan)} NaN and '
                    f'{int(inf)} inf, from finite inputs', gradients)
    name = getattr(task.loss, '__qualname__', None) or repr(task.loss)
    return Report(step, 'loss', name, f'the loss is {float(loss)} from finite model outputs',
                  gradients)
  if gradients:
    for microbatch, key in _microbatches(task, state, batch):
      found = _backward(task, state, microbatch, key)
      if found is not None:
        return _backward_report(step, found, gradients)
    leaf = dict((jax.tree_util.keystr(p), g) for p, g in flat)[gradients[0]]
    return Report(step, 'backward', gradients[0],
                  f'its gradient ({leaf.dtype}{list(leaf.shape)}) holds '
                  f'{int(np.sum(np.isnan(leaf)))} NaN and {int(np.sum(np.isinf(leaf)))} inf, '
                  f'the forward pass and the loss being finite (non-finite gradients: '
                  f'{_listed(gradients)})', gradients)
  return Report(step, 'none', '', 'the replay is finite: the forward pass, the loss and every '
                'gradient (is this the state before the update, and its batch?)')
