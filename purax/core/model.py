"""The model interface: a model is two pure functions over explicit pytrees.

.. code-block:: text

  init(key, batch) -> (params, model_state)
  apply(params, model_state, batch, *, train, rng, hparams) -> (outputs, model_state)

- ``key`` / ``rng``: typed PRNG keys (``jax.random.key``); ``rng`` is the step's
  dropout key in training, ``None`` in evaluation.
- ``batch``: whatever the data yields (any pytree); an adapter's ``inputs``
  says what the network reads from it (``'x'`` by default: ``batch['x']``).
- ``params``: the trainable pytree (float32 masters); ``model_state``: every
  other variable the model keeps (BatchNorm statistics, counters), ``{}`` when
  none. Both are plain pytrees of arrays (dicts), so they checkpoint, shard and
  vmap like any other leaf of :class:`purax.TrainState`.
- ``outputs``: whatever the loss reads (``[batch, classes]`` logits for the
  provided classification loss).
- ``hparams``: ``state.hparams`` (float32 ``[]`` leaves), passed to networks
  whose ``__call__`` accepts an ``hparams`` keyword.

Adapters give that shape to:

- flax.linen modules (:class:`Linen`): ``module(inputs, train=...)``, the
  ``train`` keyword optional; a ``mask`` keyword, when the module has one, gets
  ``batch['weight'] > 0`` so that padding reaches its batch statistics;
- Flax NNX modules (:class:`NNX`): ``nnx.split`` into a static graphdef and
  pure-dict params / state leaves, ``nnx.merge`` inside the pure step; the
  RNG streams are re-seeded from ``rng`` on every call (nothing random is
  hidden in the state);
- plain functions (:class:`Functions`);
- Equinox modules: :func:`purax.nn.equinox.from_equinox` (imported only there).

:func:`as_model` picks the adapter; :class:`purax.Task` calls it on whatever it
is given. Every adapter is a frozen, hashable dataclass, so a
:class:`purax.Task` stays a valid static argument of ``jax.jit``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from purax.core.errors import ConfigError, expect

PyTree = Any
Inputs = str | Callable[[PyTree], PyTree] | None

#: The module-call interceptor while one is installed, else None: an object
#: with ``linen()`` (a context for a linen ``apply``) and ``patched(modules)``
#: (a context for the calls of ``(path, module)`` pairs: NNX, Equinox). Set at
#: trace time by :func:`purax.inspect.intercept.intercept_calls` (the NaN
#: replay); unset, the adapters trace exactly as without it.
INTERCEPTOR: contextvars.ContextVar = contextvars.ContextVar('purax_interceptor', default=None)


def intercepted(modules: Callable[[], Any] | None = None):
  """The adapters' one seam for inspection: the installed interceptor's
  context for this ``apply``'s module calls (``modules() -> (path, module)
  pairs`` for NNX and Equinox; None: a linen module), or a null context."""
  interceptor = INTERCEPTOR.get()
  if interceptor is None:
    return contextlib.nullcontext()
  return interceptor.linen() if modules is None else interceptor.patched(modules())


@runtime_checkable
class Model(Protocol):
  """What :class:`purax.Task` needs of a model (see the module docstring)."""

  def init(self, key: jax.Array, batch: PyTree) -> tuple[PyTree, PyTree]:
    ...

  def apply(self, params: PyTree, model_state: PyTree, batch: PyTree, *, train: bool,
            rng: jax.Array | None, hparams: Mapping[str, jax.Array] | None = None
            ) -> tuple[PyTree, PyTree]:
    ...


def select_inputs(batch: PyTree, inputs: Inputs) -> PyTree:
  """What the network reads from ``batch``: ``batch[inputs]``, ``inputs(batch)``
  or the whole batch (``inputs=None``).

  Raises:
    DataError: ``inputs`` names a key the batch lacks.
  """
  if inputs is None:
    return batch
  if callable(inputs):
    return inputs(batch)
  expect(isinstance(batch, Mapping) and inputs in batch, f'batch[{inputs!r}]',
         f"present (the model reads its inputs from batch[{inputs!r}]; pass inputs=... "
         'to the adapter to read another key, a function of the batch, or None for '
         'the whole batch)',
         f'keys {sorted(batch)}' if isinstance(batch, Mapping) else type(batch).__name__)
  return batch[inputs]


def padding_mask(batch: PyTree) -> jax.Array | None:
  """``batch['weight'] > 0`` (bool ``[batch]``) when the batch carries a weight."""
  if isinstance(batch, Mapping) and 'weight' in batch:
    weight = jnp.asarray(batch['weight'])
    return weight.reshape(weight.shape[0], -1).max(axis=1) > 0
  return None


@functools.lru_cache(maxsize=None)
def _keywords(fn: Callable) -> frozenset[str]:
  """Names ``fn`` accepts as keywords (all of them if it takes ``**kwargs``)."""
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):   # builtins without a signature: pass nothing extra
    return frozenset()
  if any(p.kind is p.VAR_KEYWORD for p in params):
    return frozenset({'train', 'rng', 'hparams', 'mask', '*'})
  return frozenset(p.name for p in params
                   if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def _call_keywords(fn, positional: int = 1, **candidates) -> dict:
  """The keywords of ``candidates`` that ``fn`` accepts; ``fn`` is called with
  ``positional`` arguments before them (checked: no other required parameter)."""
  names = _keywords(fn)
  _check_required(fn, positional, set(candidates))
  return {k: v for k, v in candidates.items() if k in names}


@functools.lru_cache(maxsize=None)
def _required(fn: Callable, positional: int) -> tuple[str, ...]:
  """Parameters of ``fn`` after its ``positional`` arguments that have no default."""
  try:
    params = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):
    return ()
  if params and params[0].name == 'self':
    params = params[1:]
  return tuple(p.name for p in params[positional:] if p.default is p.empty
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _check_required(fn, positional: int, passed: set[str]) -> None:
  missing = [name for name in _required(fn, positional) if name not in passed]
  expect(not missing, f'{getattr(fn, "__qualname__", fn)}',
         f'a call purax can make: the inputs, then the keywords {sorted(passed)} when '
         'accepted (e.g. wrap a `deterministic` module in a __call__(x, train) that '
         'passes deterministic=not train)', f'required parameters {missing}', ConfigError)


# -- flax.linen ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Linen:
  """A flax.linen module as a :class:`Model`.

  The module is called as ``module(inputs, **kw)`` where ``kw`` holds
  ``train=`` when ``__call__`` accepts it, ``mask=`` (bool ``[batch]``, padding
  excluded) when it accepts one and the batch has a ``'weight'``, and
  ``hparams=`` when it accepts that. In training every non-``params``
  collection is mutable and returned as the new ``model_state``; the
  ``'dropout'`` rng is the step key.

  Attributes:
    module: the flax.linen module.
    inputs: what the module reads from the batch (see :func:`select_inputs`).
  """

  module: nn.Module
  inputs: Inputs = 'x'

  def _kwargs(self, *, train: bool, batch, hparams) -> dict:
    call = type(self.module).__call__
    return _call_keywords(call, train=train, mask=padding_mask(batch), hparams=hparams)

  def init(self, key, batch):
    param_key, dropout_key = jax.random.split(key)
    variables = self.module.init({'params': param_key, 'dropout': dropout_key},
                                 select_inputs(batch, self.inputs),
                                 **self._kwargs(train=False, batch=batch, hparams=None))
    # Logical-axis annotations (nn.with_logical_partitioning) are metadata for
    # purax.parallel; the state holds plain arrays.
    variables = dict(nn.unbox(variables))
    expect('params' in variables, 'model.init', "variables with a 'params' collection",
           sorted(variables), ConfigError)
    params = variables.pop('params')
    return params, variables

  def apply(self, params, model_state, batch, *, train, rng=None, hparams=None):
    variables = {'params': params, **model_state}
    mutable = list(model_state) if (train and model_state) else False
    rngs = {'dropout': rng} if (train and rng is not None) else {}
    with intercepted():
      out = self.module.apply(variables, select_inputs(batch, self.inputs), rngs=rngs,
                              mutable=mutable,
                              **self._kwargs(train=train, batch=batch, hparams=hparams))
    if mutable:
      outputs, new_state = out
      return outputs, {**model_state, **new_state}
    return out, model_state


# -- Flax NNX -----------------------------------------------------------------


def _pure(state) -> dict:
  return nnx.to_pure_dict(state)


@dataclasses.dataclass(frozen=True)
class NNX:
  """A Flax NNX module as a :class:`Model`.

  Build it from a constructor ``make(rngs) -> nnx.Module``
  (``NNX.from_constructor``; ``init`` then draws fresh parameters from its key,
  so ``jax.vmap(task.init)`` over seeds works) or from a built module
  (``NNX.from_module``; ``init`` returns a copy of its variables and ignores
  the key).

  The module is split into a static ``graphdef`` and three kinds of variable:
  ``nnx.Param`` (``params``), RNG streams (not stored: re-seeded on each call
  from the step key, ``fold_in(rng, i)`` for stream ``i``), and everything else
  (``model_state``: BatchNorm statistics, counters). Before the call the
  module is put in ``.train()`` or ``.eval()`` mode (``deterministic`` /
  ``use_running_average``); it is called as ``module(inputs)`` (plus
  ``mask=`` / ``hparams=`` when ``__call__`` accepts them).

  Attributes:
    graphdef: the static structure (hashable).
    make: the constructor, or None for a built module.
    initial: the built module's variables (only for ``from_module``).
    inputs: what the module reads from the batch.
  """

  graphdef: Any
  make: Callable | None = None
  initial: Any = dataclasses.field(default=None, compare=False, hash=False)
  rng_template: Any = dataclasses.field(default=None, compare=False, hash=False)
  inputs: Inputs = 'x'
  source: int = 0   # id of the built module's variables: two modules never compare equal

  @classmethod
  def from_constructor(cls, make: Callable[[nnx.Rngs], nnx.Module], *,
                       inputs: Inputs = 'x') -> 'NNX':
    """The model of the module ``make(rngs)`` builds: ``init`` calls ``make``
    with ``nnx.Rngs`` drawn from its key, so every key gives fresh parameters
    and a population vmaps over seeds.

    Args:
      make: ``rngs -> nnx.Module``, e.g. ``lambda rngs: Net(rngs=rngs)``.
      inputs: what the module reads from the batch (see :func:`select_inputs`).
    """
    abstract = nnx.eval_shape(lambda: make(nnx.Rngs(0)))
    graphdef, _, rngs, _ = nnx.split(abstract, nnx.Param, nnx.RngState, ...)
    return cls(graphdef=graphdef, make=make, rng_template=_pure(rngs), inputs=inputs)

  @classmethod
  def from_module(cls, module: nnx.Module, *, inputs: Inputs = 'x') -> 'NNX':
    graphdef, params, rngs, rest = nnx.split(module, nnx.Param, nnx.RngState, ...)
    initial = jax.tree.map(jnp.array, (_pure(params), _pure(rest)))   # copies
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _pure(rngs))
    return cls(graphdef=graphdef, initial=initial, rng_template=template, inputs=inputs,
               source=id(initial))

  def init(self, key, batch):
    del batch   # NNX modules are built with their shapes
    if self.make is None:
      return jax.tree.map(jnp.array, self.initial)
    _, params, _, rest = nnx.split(self.make(nnx.Rngs(key)), nnx.Param, nnx.RngState, ...)
    return _pure(params), _pure(rest)

  def _rngs(self, rng):
    """Fresh RNG stream variables: key ``fold_in(rng, i)``, count 0."""
    rng = jax.random.key(0) if rng is None else rng
    leaves, treedef = jax.tree.flatten(self.rng_template)
    fresh = [jax.random.fold_in(rng, i) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
             else jnp.zeros(x.shape, x.dtype) for i, x in enumerate(leaves)]
    return jax.tree.unflatten(treedef, fresh)

  def apply(self, params, model_state, batch, *, train, rng=None, hparams=None):
    module = nnx.merge(self.graphdef, params, self._rngs(rng), model_state)
    if train:
      module.train()
    else:
      module.eval()
    kwargs = _call_keywords(type(module).__call__, mask=padding_mask(batch), hparams=hparams)
    with intercepted(lambda: nnx.iter_modules(module)):
      outputs = module(select_inputs(batch, self.inputs), **kwargs)
    _, _, _, rest = nnx.split(module, nnx.Param, nnx.RngState, ...)
    return outputs, (_pure(rest) if train else model_state)


# -- plain functions ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Functions:
  """A model written as plain pure functions.

  ``init_fn(key, inputs)`` returns ``params`` (or ``(params, model_state)``
  with ``stateful=True``); ``apply_fn(params, inputs)`` returns ``outputs``
  (or, stateful, ``apply_fn(params, model_state, inputs) -> (outputs,
  model_state)``). ``apply_fn`` also gets ``train=``, ``rng=`` and
  ``hparams=`` when it accepts them as keywords.

  Attributes:
    init_fn, apply_fn: the functions (hashed by identity).
    stateful: whether they carry a ``model_state``.
    inputs: what the functions read from the batch.
  """

  init_fn: Callable
  apply_fn: Callable
  stateful: bool = False
  inputs: Inputs = 'x'

  def init(self, key, batch):
    out = self.init_fn(key, select_inputs(batch, self.inputs))
    if self.stateful:
      expect(isinstance(out, tuple) and len(out) == 2, 'init_fn(key, inputs)',
             '(params, model_state) with stateful=True', type(out).__name__, ConfigError)
      return out
    return out, {}

  def apply(self, params, model_state, batch, *, train, rng=None, hparams=None):
    kwargs = _call_keywords(self.apply_fn, 3 if self.stateful else 2, train=train, rng=rng,
                            hparams=hparams)
    x = select_inputs(batch, self.inputs)
    if self.stateful:
      return self.apply_fn(params, model_state, x, **kwargs)
    return self.apply_fn(params, x, **kwargs), model_state


def takes_hparams(model: Model) -> bool | None:
  """Whether the adapted network reads ``hparams`` (None: cannot tell)."""
  if isinstance(model, Linen):
    return 'hparams' in _keywords(type(model.module).__call__)
  if isinstance(model, Functions):
    return 'hparams' in _keywords(model.apply_fn)
  return None


def as_model(model: Any) -> Model:
  """The :class:`Model` for ``model``: a linen module, an NNX module, a
  constructor ``make(rngs) -> nnx.Module`` is not guessed (use
  :meth:`NNX.from_constructor`), or anything with ``init``/``apply`` of the
  interface (returned as is).

  Raises:
    ConfigError: ``model`` is none of these.
  """
  if isinstance(model, nn.Module):
    return Linen(model)
  if isinstance(model, nnx.Module):
    return NNX.from_module(model)
  if isinstance(model, (Linen, NNX, Functions)) or (
      callable(getattr(model, 'init', None)) and callable(getattr(model, 'apply', None))):
    return model
  raise ConfigError(
      f'model: expected a flax.linen Module, a flax.nnx Module, purax.Functions('
      f'init_fn, apply_fn), or an object with init(key, batch) and apply(params, '
      f'model_state, batch, *, train, rng), got {type(model).__name__}')
