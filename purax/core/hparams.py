"""Hyperparameters in the state: one get/set for single and stacked states,
and one table of their bounds.

A state carries its hyperparameters as float32 arrays, so that a new value
is a new state, not a recompilation, and a population stacks them
``[members]``: the optimizer's in every ``optax.inject_hyperparams`` state
inside ``opt_state`` (at any depth: ``optax.chain``, ``optax.multi_transform``,
``optax.masked``), the loss's and model's in ``state.hparams``. :func:`get`
reads them all, :func:`set` replaces them wherever they are, and
:data:`BOUNDS` (:mod:`purax.core.bounds`) is the one table of their valid
intervals (every optimizer builder, the command line and :func:`set` check
against it, PBT clips to it).

A hyperparameter has one name from the command line to the log
(``--learning-rate``, the config field, the builder's argument, the state,
``train/learning_rate``); :data:`RENAMED` maps the names of purax before 0.3
(``peak_learning_rate``), which :func:`set` and PBT still take, with a
``DeprecationWarning``, and old checkpoints restore under (:func:`renamed`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from purax.core.bounds import BOUNDS as BOUNDS
from purax.core.bounds import DEFAULT_BOUNDS as DEFAULT_BOUNDS
from purax.core.bounds import RENAMED as RENAMED
from purax.core.bounds import Bounds as Bounds
from purax.core.bounds import bounds as bounds
from purax.core.errors import ConfigError, expect
from purax.core.optim import ScheduledTransformation




def canonical(name: str) -> str:
  """``name`` as the state spells it today: an old name of :data:`RENAMED` is
  mapped to its new one with a ``DeprecationWarning``; any other is itself."""
  if name in RENAMED:
    warnings.warn(f'purax: hyperparameter {name!r} is deprecated: use {RENAMED[name]!r} '
                  '(the same value; it goes in 0.4, CHANGELOG.md)', DeprecationWarning,
                  stacklevel=3)
    return RENAMED[name]
  return name


def _is_injected(x) -> bool:
  return hasattr(x, 'hyperparams') and hasattr(x, 'inner_state')


def _injected(opt_state) -> list:
  """Every ``inject_hyperparams`` state in ``opt_state``, outermost first."""
  found = []
  for node in jax.tree.leaves(opt_state, is_leaf=_is_injected):
    if _is_injected(node):
      found.append(node)
      found.extend(_injected(node.inner_state))
  return found


def renamed(tree, mapping: Mapping[str, str]):
  """``tree`` with the hyperparameters of every ``inject_hyperparams`` state in
  it (at any depth) renamed by ``mapping`` (``old -> new``); everything else,
  leaves included, as it was. Works on concrete and abstract trees: the
  checkpoint layout restores a checkpoint of old names through it
  (:func:`purax.io.checkpoint.layout.as_saved`)."""
  def rename(node):
    if not _is_injected(node):
      return node
    inner = jax.tree.map(rename, node.inner_state, is_leaf=_is_injected)
    return node._replace(hyperparams={mapping.get(k, k): v for k, v in node.hyperparams.items()},
                         inner_state=inner)
  return jax.tree.map(rename, tree, is_leaf=_is_injected)


def names(state) -> tuple[str, ...]:
  """The hyperparameters ``state`` carries: the optimizer's, then ``state.hparams``."""
  opt = {n for node in _injected(state.opt_state) for n in node.hyperparams}
  return tuple(sorted(opt)) + tuple(sorted({*(getattr(state, 'hparams', None) or {})} - opt))


class _OptimizerOnly:
  """An optimizer state where :func:`set` takes a state (the form before 0.2)."""

  def __init__(self, opt_state):
    self.opt_state, self.hparams = opt_state, {}

  def replace(self, opt_state, hparams):
    del hparams
    return _OptimizerOnly(opt_state)


def _check_state(state) -> None:
  expect(hasattr(state, 'opt_state'), 'state', 'a purax.TrainState (with opt_state and '
         'hparams)', type(state).__name__, ConfigError)


def get(state, tx=None, *, applied: bool = False) -> dict[str, jax.Array]:
  """Every hyperparameter of a state, the current learning rate included.

  Args:
    state: a :class:`purax.TrainState` (or any object with ``opt_state`` and
      ``hparams``); a stacked (population) state gives ``[members]`` values.
    tx: the state's optax transformation (``task.tx``); given, and saying its
      rate (:func:`purax.adamw`, the optimizers of :mod:`purax.core.optimizers`),
      ``'learning_rate'`` is the rate the schedule gives at the state's step
      instead of the one stored (the schedule's peak, :func:`purax.core.optim.scheduled`).
    applied: ``'learning_rate'`` with ``tx`` is the rate the last
      update applied (what a log point reports), not the next one. An
      ``inject_hyperparams`` schedule's value in ``opt_state`` is always the
      last update's (optax stores the value it applied).

  Returns:
    ``name -> float32 array``: the optimizer's injected hyperparameters (of
    every ``inject_hyperparams`` in ``opt_state``; a name injected twice reads
    the outermost), the loss and model ones (``state.hparams``), and, with a
    ``tx`` that has ``learning_rate(opt_state)``, ``'learning_rate'`` replaced
    by the rate the next update applies (``applied``: the last update
    applied); without ``tx``, the stored peak.
  """
  _check_state(state)
  found = {}
  for node in reversed(_injected(state.opt_state)):
    found.update(node.hyperparams)
  found.update(dict(getattr(state, 'hparams', None) or {}))
  if tx is not None and callable(getattr(tx, 'learning_rate', None)):
    found['learning_rate'] = (tx.learning_rate(state.opt_state, applied=True)
                              if applied and isinstance(tx, ScheduledTransformation)
                              else tx.learning_rate(state.opt_state))
  return found


#: The interval of a hyperparameter that :func:`set` checks without a row in
#: :data:`BOUNDS` (a user's loss or model hyperparameter may be negative): finite.
FINITE = Bounds(-math.inf, math.inf, low_open=True, high_open=True)


def check(name: str, value) -> None:
  """Checks a concrete value of hyperparameter ``name``: finite and, for a name
  of :data:`BOUNDS`, inside its interval.

  Args:
    name: the hyperparameter's name in the state.
    value: a number or an array (``[members]`` for a stacked state). A value
      traced under ``jit`` / ``vmap`` is not checked (it has no value yet; the
      step's guard skips an update that a non-finite one would spoil, see
      :func:`all_finite`).

  Raises:
    ConfigError: ``hyperparameter NAME: expected a finite value in
      INTERVAL, got VALUE``, naming the member (``NAME[i]``) of an array.
  """
  if isinstance(value, jax.core.Tracer):
    return
  rule = BOUNDS.get(RENAMED.get(name, name), FINITE)
  try:
    value = np.asarray(value, np.float64)
  except (TypeError, ValueError):
    raise ConfigError(f'hyperparameter {name}: expected a number or an array of numbers, '
                      f'got {type(value).__name__} {value!r:.60}') from None
  for index, v in np.ndenumerate(value):
    rule.check(v, f'hyperparameter {name}' + (f'{list(index)}' if index else ''))


def all_finite(state) -> jax.Array:
  """bool ``[]``: every hyperparameter of ``state`` (:func:`get`, without the
  schedule) is finite. Traceable and nearly free (a few scalars): the step's
  guard ands it with the loss and the gradient norm, so a non-finite value
  that reached the state past :func:`check` (written into ``opt_state``
  directly, or traced) skips the update instead of spoiling every parameter."""
  values = [jnp.all(jnp.isfinite(v)) for v in get(state).values()]
  return jnp.all(jnp.stack(values)) if values else jnp.ones((), bool)


def _check_like(name: str, value, current) -> None:
  """``value`` can take ``current``'s place in the state: a real number (not a
  bool or a complex) of its shape (``[]``, or ``[members]`` of a stacked state),
  so that the state's structure, and its checkpoints, stay what they were.

  Raises:
    ConfigError: another shape or kind of value (named).
  """
  dtype = np.asarray(value).dtype if not hasattr(value, 'dtype') else np.dtype(value.dtype)
  expect(dtype.kind in 'iuf' and dtype != np.bool_, f'hyperparameter {name}',
         'a real number (float32 in the state)', f'a value of dtype {dtype}', ConfigError)
  expect(np.shape(value) == np.shape(current), f'hyperparameter {name}',
         f'shape {tuple(np.shape(current))} (its shape in the state'
         + (': one value per member' if np.ndim(current) else '') + ')',
         f'shape {tuple(np.shape(value))}', ConfigError)


def _value(name: str, value) -> jax.Array:
  """``value`` as a new float32 array (a caller's array never becomes a state
  leaf, so a donating step cannot delete it), :func:`check`-ed. A concrete
  value is copied on the host and put on the device (nothing compiled); a
  traced one is converted in the trace."""
  check(name, value)
  if isinstance(value, jax.core.Tracer):
    return jnp.array(value, jnp.float32, copy=True)
  return jax.device_put(np.array(value, np.float32))


def set(state, values: Mapping[str, Any] | None = None, **kwargs):  # pylint: disable=redefined-builtin
  """``state`` with hyperparameters replaced, wherever they are.

  Example:
    >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
    ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
    >>> state = task.init(jax.random.key(0), batch)
    >>> state = purax.set_hyperparams(state, learning_rate=3e-4)
    >>> float(purax.hyperparams(state)['learning_rate'])
    0.0003000000142492354

  Each value goes to every ``inject_hyperparams`` state in ``opt_state`` that
  has the name (at any depth) and to ``state.hparams`` when it has it; a
  stacked state takes ``[members]`` values. Traceable (PBT sets them in jit).

  A name of purax before 0.3 (``peak_learning_rate``, :data:`RENAMED`) sets
  its new one, with a ``DeprecationWarning``, until 0.4.

  ``set(state.opt_state, name=value)`` (an optimizer state, the form before
  0.2) returns the optimizer state with the values set: deprecated, with a
  ``DeprecationWarning``, until 0.4.

  Raises:
    ConfigError: a name the state does not carry, a non-finite value, or a
      value outside its :data:`BOUNDS` interval (:func:`check`: named, with
      the member of a stacked value; values traced under ``jit`` / ``vmap``
      are not checked, and the step's guard skips an update they would spoil).
  """
  if not hasattr(state, 'opt_state') and _injected(state):
    warnings.warn('purax: set_hyperparams(opt_state, ...) is deprecated since 0.2 and goes '
                  'in 0.4: pass the state, set_hyperparams(state, ...), which returns the '
                  'state (CHANGELOG.md)', DeprecationWarning, stacklevel=2)
    return set(_OptimizerOnly(state), values, **kwargs).opt_state
  _check_state(state)
  expect(values is None or isinstance(values, Mapping), 'values', 'None or a mapping name -> '
         'value', type(values).__name__, ConfigError)
  values = {canonical(name): value for name, value in {**(values or {}), **kwargs}.items()}
  known = names(state)
  for name in values:
    expect(name in known, 'hyperparameter name', f'one of {list(known)}', repr(name),
           ConfigError)
  current = get(state)
  for name, value in values.items():
    _check_like(name, value, current[name])
  values = {name: _value(name, v) for name, v in values.items()}

  def replace(node):
    if not _is_injected(node):
      return node
    inner = jax.tree.map(replace, node.inner_state, is_leaf=_is_injected)
    return node._replace(hyperparams={k: values.get(k, v) for k, v in node.hyperparams.items()},
                         inner_state=inner)

  opt_state = jax.tree.map(replace, state.opt_state, is_leaf=_is_injected)
  hparams = {k: values.get(k, v) for k, v in (getattr(state, 'hparams', None) or {}).items()}
  return state.replace(opt_state=opt_state, hparams=hparams)
