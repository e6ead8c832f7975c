"""An Equinox module as a :class:`purax.core.model.Model` (imports equinox on use).

Equinox modules are pytrees whose array leaves are the parameters
(``eqx.partition(model, eqx.is_inexact_array)``) and whose layers usually
take one example at a time; the adapter vmaps over the batch axis. Stateful
layers (``eqx.nn.BatchNorm`` with ``eqx.nn.State``) are not supported here:
their batch statistics need an ``axis_name`` inside the model.

Example::

  import equinox as eqx
  model = eqx.nn.MLP(4, 3, width_size=16, depth=1, key=jax.random.key(0))
  task = purax.Task(model=from_equinox(model), tx=optax.adam(1e-3))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from purax.core.model import Inputs, select_inputs


@dataclasses.dataclass(frozen=True)
class Equinox:
  """Adapter of :func:`from_equinox` (frozen, hashable by the static part).

  Attributes:
    static: the non-array part of the module (``eqx.partition``'s second half).
    initial: the module's initial parameters (returned by ``init``, copied).
    inputs: what the module reads from the batch.
    per_example: call the module on one example at a time (``jax.vmap``
      over the leading axis of the inputs; each example gets its own dropout
      key, ``fold_in(rng, i)``); False: call it on the whole batch.
    source: identity of the initial parameters (two modules never compare equal).
  """

  static: Any
  initial: Any = dataclasses.field(compare=False, hash=False)
  inputs: Inputs = 'x'
  per_example: bool = True
  source: int = 0

  def init(self, key, batch):
    del key, batch   # an Equinox module is built with its parameters
    return jax.tree.map(jnp.array, self.initial), {}

  def apply(self, params, model_state, batch, *, train, rng=None, hparams=None):
    import equinox as eqx
    del hparams
    model = eqx.nn.inference_mode(eqx.combine(params, self.static), value=not train)
    x = select_inputs(batch, self.inputs)
    key = rng if (train and rng is not None) else None
    if not self.per_example:
      return model(x, key=key), model_state
    n = jax.tree.leaves(x)[0].shape[0]
    keys = (jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n))
            if key is not None else None)
    if keys is None:
      return jax.vmap(lambda xi: model(xi))(x), model_state
    return jax.vmap(lambda xi, ki: model(xi, key=ki))(x, keys), model_state


def from_equinox(model, *, inputs: Inputs = 'x', per_example: bool = True) -> Equinox:
  """The :class:`Equinox` adapter of ``model`` (an ``eqx.Module``).

  Args:
    model: the module; its inexact arrays are the parameters (``params``),
      everything else is static.
    inputs: what the module reads from the batch (``batch['x']`` by default).
    per_example: vmap the module over the batch (Equinox's convention of
      single-example layers); False when it takes a batch itself.

  Raises:
    ImportError: equinox is not installed (``pip install equinox``).
  """
  import equinox as eqx
  params, static = eqx.partition(model, eqx.is_inexact_array)
  initial = jax.tree.map(jnp.array, params)
  return Equinox(static=static, initial=initial, inputs=inputs, per_example=per_example,
                 source=id(initial))
