"""An Equinox module as a :class:`purax.core.model.Model` (imports equinox on use).

Equinox modules are pytrees whose array leaves are the parameters
(``eqx.partition(model, eqx.is_inexact_array)``) and whose layers usually
take one example at a time; the adapter vmaps over the batch axis.

What the adapter supports, as the linen and NNX adapters do:

- **init from the key**: given a constructor ``key -> module`` the adapter's
  ``init(key)`` builds the module from that key (traceable: vmapped inits
  and populations over seeds get different members). Given a module, its
  own parameters are the initial ones whatever the key (Equinox builds
  parameters eagerly): pass a constructor to seed from ``init``.
- **dropout from the step key**: each example gets ``fold_in(rng, i)`` of the
  step's key; evaluation runs in ``eqx.nn.inference_mode``.
- **state** (``eqx.nn.BatchNorm``, ``eqx.nn.StateIndex``): a constructor
  that returns ``(module, state)`` (``eqx.nn.make_with_state``), or
  ``from_equinox(module, state=state)``. The module is called as
  ``module(x, state, key=...) -> (y, state)``, vmapped with ``axis_name``
  (``'batch'``, what BatchNorm's ``axis_name`` must say), so batch statistics
  are over the whole batch; ``state`` is ``model_state``, checkpointed and
  carried like linen's ``batch_stats``.

Example:
  >>> import equinox as eqx
  >>> from purax.nn.equinox import from_equinox
  >>> make = lambda key: eqx.nn.MLP(64, 10, width_size=16, depth=1, key=key)
  >>> flat = lambda batch: batch['x'].reshape(batch['x'].shape[0], 64)   # [batch, 64]
  >>> task = purax.Task(model=from_equinox(make, inputs=flat), tx=optax.adam(1e-3))
  >>> state = task.init(jax.random.key(0), batch)
  >>> state, metrics = jax.jit(task.step)(state, batch)

  With BatchNorm (``axis_name='batch'``), pass a constructor that returns the
  module and its state, ``lambda key: eqx.nn.make_with_state(Net)(key)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from purax.core.model import Inputs, intercepted, select_inputs


@dataclasses.dataclass(frozen=True)
class Equinox:
  """Adapter of :func:`from_equinox` (frozen, hashable by the static part).

  Attributes:
    static: the non-array part of the module (``eqx.partition``'s second half).
    initial: the module's initial parameters (returned by ``init`` without a
      constructor, copied).
    initial_state: the module's initial ``eqx.nn.State``, or None (stateless).
    constructor: ``key -> module`` or ``key -> (module, state)``, or None.
    inputs: what the module reads from the batch.
    per_example: call the module on one example at a time (``jax.vmap``
      over the leading axis of the inputs, ``axis_name``; each example gets
      its own dropout key, ``fold_in(rng, i)``); False: call it on the batch.
    axis_name: the vmapped axis' name (BatchNorm's ``axis_name``).
    source: identity of the initial parameters (two modules never compare equal).
  """

  static: Any
  initial: Any = dataclasses.field(compare=False, hash=False)
  initial_state: Any = dataclasses.field(default=None, compare=False, hash=False)
  constructor: Callable | None = dataclasses.field(default=None, compare=False, hash=False)
  inputs: Inputs = 'x'
  per_example: bool = True
  axis_name: str = 'batch'
  source: int = 0

  def init(self, key, batch):
    """``(params, model_state)``: built from ``key`` with a constructor, else the
    module's own (``model_state`` is the ``eqx.nn.State``, or ``{}``)."""
    del batch
    if self.constructor is None:
      params, state = jax.tree.map(jnp.array, self.initial), self.initial_state
    else:
      params, _, state = _split(self.constructor(key))
    return params, ({} if state is None else jax.tree.map(jnp.array, state))

  def apply(self, params, model_state, batch, *, train, rng=None, hparams=None):
    import equinox as eqx
    del hparams
    model = eqx.nn.inference_mode(eqx.combine(params, self.static), value=not train)
    x = select_inputs(batch, self.inputs)
    key = rng if (train and rng is not None) else None
    stateful = self.initial_state is not None

    def call(xi, ki, st):
      kwargs = {} if ki is None else {'key': ki}
      return model(xi, st, **kwargs) if stateful else (model(xi, **kwargs), st)
    with intercepted(lambda: _modules(model)):
      if not self.per_example:
        return call(x, key, model_state)
      n = jax.tree.leaves(x)[0].shape[0]
      keys = (jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n))
              if key is not None else None)
      # The state goes in unbatched and comes out unbatched: BatchNorm reduces
      # its statistics over the vmapped axis (axis_name), so they are the batch's.
      return jax.vmap(call, in_axes=(0, None if keys is None else 0, None),
                      out_axes=(0, None), axis_name=self.axis_name)(x, keys, model_state)


def _modules(node, path=()):
  """``(path, module)`` of every ``eqx.Module`` in ``node`` (fields, lists,
  tuples, dicts), the root's path ``()``: what :func:`purax.core.model.intercepted`
  hands the interceptor."""
  import equinox as eqx
  if isinstance(node, eqx.Module):
    yield path, node
    children = [(f.name, getattr(node, f.name, None)) for f in dataclasses.fields(node)]
  elif isinstance(node, (list, tuple)):
    children = list(enumerate(node))
  elif isinstance(node, dict):
    children = list(node.items())
  else:
    return
  for name, child in children:
    yield from _modules(child, (*path, name))


def _split(built):
  """``(params, static, state)`` of a module or a ``(module, state)`` pair."""
  import equinox as eqx
  module, state = built if isinstance(built, tuple) else (built, None)
  params, static = eqx.partition(module, eqx.is_inexact_array)
  return params, static, state


def from_equinox(model, *, state=None, inputs: Inputs = 'x', per_example: bool = True,
                 axis_name: str = 'batch') -> Equinox:
  """The :class:`Equinox` adapter of ``model``.

  Args:
    model: an ``eqx.Module`` (its inexact arrays are the parameters, the rest
      static), or a constructor ``key -> module`` / ``key -> (module, state)``
      (``eqx.nn.make_with_state``) that ``init`` calls with its key.
    state: the module's ``eqx.nn.State`` (with a module; a constructor returns it).
    inputs: what the module reads from the batch (``batch['x']`` by default).
    per_example: vmap the module over the batch (Equinox's convention of
      single-example layers); False when it takes a batch itself.
    axis_name: the name of the vmapped batch axis (BatchNorm's ``axis_name``).

  Raises:
    ImportError: equinox is not installed (``pip install equinox``).
  """
  import equinox as eqx
  constructor = None
  if not isinstance(model, eqx.Module) and callable(model):
    constructor, built = model, model(jax.random.key(0))   # the structure, once
  else:
    built = model if state is None else (model, state)
  params, static, initial_state = _split(built)
  initial = jax.tree.map(jnp.array, params)
  return Equinox(static=static, initial=initial, initial_state=initial_state,
                 constructor=constructor, inputs=inputs, per_example=per_example,
                 axis_name=axis_name, source=id(initial))
