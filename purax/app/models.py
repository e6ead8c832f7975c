"""The model table of the command line, and the ``model`` config section.

:data:`MODELS` maps a name to a flax.linen class, named by import path
(``'purax.nn.mlp:MLP'``, imported on first use: the table and ``--help``
need no flax). :func:`build` constructs it from the :class:`ModelConfig`
section: each option of the section that the class declares as a field
(``dropout_rate``, ``d_model``, ``num_layers``, ``num_heads``, ``remat``,
``scan_layers``) is passed when set; one it does not declare is refused by
name. The number of classes goes to ``num_classes`` (or
``vocab_size``), the sequence length to ``max_len``, and the precision's
dtypes to ``dtype`` / ``param_dtype``.

Adding a model to the CLI is its module (e.g. ``purax/nn/mine.py``) plus one
row here (``'purax.nn.mine:Mine'``); an option of its own is one more field
of :class:`ModelConfig`.

Your own model needs no row: ``--model mypkg.nets:make_net`` names a factory
by import path and :func:`spec` builds its row on the fly (``config.json``
records the path; eval, export and resume import it again). The factory is
called with keywords, each only when its signature names it:

- ``num_classes`` (int): the data set's number of classes;
- ``input_shape`` (tuple of int): one example's shape, e.g. ``(8, 8, 1)``;
- ``rngs`` (``flax.nnx.Rngs``): then the factory builds an NNX module and is
  called again for every initialization key
  (:meth:`purax.core.model.NNX.from_constructor`: each seed its own params);
- ``dtype``, ``param_dtype``: the ``--precision``'s compute and parameter
  dtypes (a factory without ``dtype`` trains in float32: ``--precision auto``
  records ``fp32`` for it, another precision is refused);
- any of the options ``dropout_rate``, ``d_model``, ``num_layers``,
  ``num_heads``, ``remat``, ``scan_layers`` when given (one it does not name
  is refused, as for the built-in models).

It returns a flax.linen Module, a flax.nnx Module, or any model
:func:`purax.core.model.as_model` accepts (``purax.Functions``,
``purax.nn.equinox.from_equinox``, an object with ``init`` / ``apply``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Annotated, Sequence

import tyro
from tyro.constructors import PrimitiveConstructorSpec

from purax.core import lazy
from purax.core.errors import ConfigError, expect

# Used by the methods, not by the definitions (the parser reads those): imported on use.
model_lib, nnx, precision_lib, remat_lib, transformer_lib = lazy.modules(
    'purax.core.model', 'flax.nnx', 'purax.core.precision', 'purax.nn.remat',
    'purax.nn.transformer')


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A row of the table.

  Attributes:
    model: the flax.linen class, or its import path (``'purax.nn.mlp:MLP'``);
      for a user's factory its import path (``'mypkg.nets:make_net'``).
    help: one line for ``--help`` and the README.
    tokens: takes int32 token ids ``[batch, seq]`` and gives logits
      ``[batch, seq, vocab]`` (a language model: text data sets only).
    factory: ``model`` names a user's factory (see the module docstring),
      not a flax.linen class of purax.
  """

  model: type | str
  help: str
  tokens: bool = False
  factory: bool = False

  @property
  def cls(self) -> type:
    """The flax.linen class (imported on first use when the row names it by
    path), or the user's factory (imported: ConfigError naming what fails)."""
    if not self.factory:
      return lazy.resolve(self.model)
    factory = lazy.user(self.model, 'model')
    expect(callable(factory), 'model', f'{self.model} to be a function or class '
           '(num_classes, ...) -> model', type(factory).__name__, ConfigError)
    return factory

  @property
  def defaults(self) -> dict:
    """The keywords the model takes -> their defaults (``dataclasses.MISSING``
    or ``inspect.Parameter.empty`` where none)."""
    if not self.factory:
      return {f.name: f.default for f in dataclasses.fields(self.cls)}
    try:
      params = inspect.signature(self.cls).parameters.values()
    except (TypeError, ValueError):   # no signature to read: num_classes only
      return {'num_classes': inspect.Parameter.empty}
    return {p.name: p.default for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

  @property
  def fields(self) -> frozenset[str]:
    """The model class's fields (a factory's keywords)."""
    return frozenset(self.defaults)

  def check_factory(self) -> None:
    """A factory's required parameters are keywords purax passes.

    Raises:
      ConfigError: a required parameter purax cannot fill (named).
    """
    if not self.factory:
      return
    empty = (inspect.Parameter.empty, dataclasses.MISSING)
    unknown = sorted(n for n, d in self.defaults.items()
                     if d in empty and n not in FACTORY_KEYWORDS)
    expect(not unknown, 'model', f'a factory {self.model} whose required parameters are '
           f"among {', '.join(FACTORY_KEYWORDS)}", f'required parameters {unknown}',
           ConfigError)

  @property
  def options(self) -> frozenset[str]:
    """The :class:`ModelConfig` options this model takes."""
    return self.fields & frozenset(OPTIONS)


#: The model table: ``--model`` name -> :class:`ModelSpec` (flax class, help).
MODELS: dict[str, ModelSpec] = {
    'mlp': ModelSpec('purax.nn.mlp:MLP', 'multilayer perceptron over the flattened features'),
    'cnn': ModelSpec('purax.nn.cnn:CNN',
                     'two convolutions, max pooling and a dense head (1-D or 2-D inputs)'),
    'resnet': ModelSpec('purax.nn.resnet:ResNet',
                        'a small ResNet with BatchNorm (1-D or 2-D inputs)'),
    'transformer': ModelSpec('purax.nn.transformer:TransformerEncoder',
                             'an encoder classifier over the sequence axis'),
    'lm': ModelSpec('purax.nn.transformer:DecoderLM',
                    'a byte-level decoder language model (text data sets)', tokens=True),
}

#: Options of :class:`ModelConfig` that go to the model class when it declares them.
OPTIONS = ('dropout_rate', 'd_model', 'num_layers', 'num_heads', 'remat', 'scan_layers')

#: The keywords a user's factory may name (the module docstring says what each is).
FACTORY_KEYWORDS = ('num_classes', 'input_shape', 'rngs', 'dtype', 'param_dtype', *OPTIONS)


@functools.lru_cache(maxsize=64)
def spec(name: str) -> ModelSpec:
  """The row of ``--model name``: a key of :data:`MODELS`, or a row built on
  the fly for a factory's import path ``module.path:factory`` (nothing imported yet).

  Raises:
    ConfigError: neither (naming the known models and the form of a path).
  """
  if name in MODELS:
    return MODELS[name]
  if not lazy.is_import_path(name):
    raise lazy.expected_path('model', name, MODELS, 'FACTORY')
  return ModelSpec(name, f'your own model: {name}(num_classes, ...)', factory=True)


def _parse_name(args: list[str]) -> str:
  """``--model``'s value as the parser reads it: a table key or an import path."""
  (name,) = args
  if name not in MODELS and not lazy.is_import_path(name):
    raise lazy.expected_path('model', name, MODELS, 'FACTORY')
  return name


#: ``--model``: a key of :data:`MODELS` or ``MODULE:FACTORY``, checked by the
#: parser (no import: the factory is imported once parsing is done).
ModelName = Annotated[str, PrimitiveConstructorSpec(
    nargs=1, metavar='{' + ','.join(MODELS) + '}|MODULE:FACTORY', instance_from_str=_parse_name,
    is_instance=lambda x: isinstance(x, str), str_from_instance=lambda x: [x])]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model.

  Attributes:
    name: model name (a key of purax.app.models.MODELS), or your own model's
      factory as MODULE:FACTORY (e.g. mypkg.nets:make_net, importable from
      PYTHONPATH or the current directory; called with the keywords it names
      among num_classes, input_shape, rngs, dtype and the options above:
      purax.app.models).
    dropout_rate: dropout rate of the model (mlp, cnn, transformer, lm).
    d_model: width of transformer/lm; when unset the model's own.
    num_layers: layers of transformer/lm; when unset the model's own.
    num_heads: attention heads of transformer/lm; when unset the model's own.
    remat: gradient checkpointing policy of resnet/transformer/lm blocks:
      none, full, dots_saveable, dots_with_no_batch_dims_saveable, ...
    scan_layers: transformer/lm: True stacks the layers with nn.scan (compile
      time flat in depth), False unrolls them (faster when shallow); when unset
      scanned above purax.nn.transformer.SCAN_LAYERS_ABOVE layers. A run
      records the choice in config.json.
    precision: 'auto' (bf16 on a GPU or TPU, fp32 on the CPU; config.json
      records the one chosen), 'fp32', 'bf16' (params float32, compute
      bfloat16), 'fp16' (with dynamic loss scaling), 'fp8' (bf16 with the
      transformer/lm matmuls in float8, for H100/H200) or
      'params=DTYPE,compute=DTYPE[,matmul=float8]' (',output=float32' is
      accepted: losses are computed in float32).
  """

  name: Annotated[ModelName, tyro.conf.arg(name='model')] = 'cnn'
  dropout_rate: float = 0.0
  d_model: int | None = None
  num_layers: int | None = None
  num_heads: int | None = None
  remat: str = 'none'
  scan_layers: bool | None = None
  precision: str = 'auto'

  @property
  def spec(self) -> ModelSpec:
    """The row of the table (built on the fly for a factory: :func:`spec`)."""
    return spec(self.name)

  def validate(self) -> 'ModelConfig':
    """Raises ConfigError naming the field, the expected and the actual value
    (a factory is imported: ConfigError naming what fails)."""
    self.spec.check_factory()
    expect(0 <= self.dropout_rate < 1, 'dropout_rate', 'in [0, 1)', self.dropout_rate,
           ConfigError)
    for name in ('d_model', 'num_layers', 'num_heads'):
      value = getattr(self, name)
      expect(value is None or 1 <= value < 2 ** 31, name, '>= 1 or unset', value, ConfigError)
    remat_lib.check_remat(self.remat)
    fp8_models = [n for n, m in MODELS.items() if 'fp8' in m.fields]
    expect(not precision_lib.get_policy(self.precision).fp8 or self.name in fp8_models,
           'precision', f'a policy without float8 matmuls for --model {self.name} (float8 matmuls: '
           f"{', '.join(fp8_models)})", repr(self.precision), ConfigError)
    takes = self.spec.options
    defaults = {f.name: f.default for f in dataclasses.fields(self)}
    for name in OPTIONS:
      unset = getattr(self, name) is None or getattr(self, name) == defaults[name]
      expect(unset or name in takes, name,
             f"unset for --model {self.name} (its options: {', '.join(sorted(takes)) or 'none'})",
             repr(getattr(self, name)), ConfigError)
    expect(self.precision == 'auto' or self._takes_dtype()
           or precision_lib.canonical(self.precision) == 'fp32', 'precision',
           f'fp32 or auto for --model {self.name} (a factory without a dtype= keyword '
           'computes in float32)', repr(self.precision), ConfigError)
    return self

  def _takes_dtype(self) -> bool:
    return not self.spec.factory or 'dtype' in self.spec.fields

  def with_sizes(self) -> 'ModelConfig':
    """Sizes left unset taken from the model class's defaults, an unset
    ``scan_layers`` resolved by :func:`purax.nn.transformer.scans` and the
    precision by :func:`purax.core.precision.canonical` (``auto`` for this
    platform; one name per policy), so that a saved config records the
    parameter structure and precision trained (a later change of a model
    default, of the scan rule or of the platform cannot change what a saved
    run restores, and a resume elsewhere is compared with what it trained)."""
    defaults = self.spec.defaults
    config = dataclasses.replace(self, **{k: defaults[k] for k in ('d_model', 'num_layers',
                                                                   'num_heads')
                                          if getattr(self, k) is None and k in defaults
                                          and isinstance(defaults[k], int)},
                                 precision=precision_lib.canonical(
                                     self.precision if self._takes_dtype() else 'fp32'))
    if config.scan_layers is None and 'scan_layers' in defaults and not self.spec.factory:
      config = dataclasses.replace(config, scan_layers=transformer_lib.scans(
          config.num_layers, defaults['scan_layers']))
    return config

  def saved_before_scan_layers(self) -> 'ModelConfig':
    """This section as read from a ``config.json`` that has no ``scan_layers``
    (written before it was an option): transformer/lm layers were then always
    scanned, so ``scan_layers=True`` for a model that takes it."""
    if self.name in MODELS and 'scan_layers' in self.spec.options and self.scan_layers is None:
      return dataclasses.replace(self, scan_layers=True)
    return self


def build(config: ModelConfig, *, num_classes: int, seq_len: int | None = None,
          input_shape: Sequence[int] | None = None):
  """The model of ``config`` for ``num_classes`` classes (a language model's
  vocabulary size) and, for a model with ``max_len``, sequences of ``seq_len``;
  a user's factory is called as the module docstring says (``input_shape``:
  one example's shape).

  Raises:
    ConfigError: a factory that does not import, or returns no model (naming
      its type).
  """
  row = config.spec
  fields = row.fields
  kwargs = {k: getattr(config, k) for k in OPTIONS
            if k in fields and getattr(config, k) is not None}
  if row.factory:
    return _from_factory(row, config, kwargs, num_classes=num_classes, input_shape=input_shape)
  kwargs.update(precision_lib.get_policy(config.precision).model_kwargs())
  kwargs['vocab_size' if 'vocab_size' in fields else 'num_classes'] = num_classes
  if 'max_len' in fields and seq_len is not None:
    kwargs['max_len'] = seq_len
  return row.cls(**kwargs)


def _from_factory(row: ModelSpec, config: ModelConfig, kwargs: dict, *, num_classes: int,
                  input_shape):
  """The model a user's factory returns, checked (see :func:`build`)."""
  factory, fields = row.cls, row.fields
  dtypes = precision_lib.get_policy(config.precision).model_kwargs()
  offered = {'num_classes': num_classes, 'dtype': dtypes['dtype'],
             'param_dtype': dtypes['param_dtype'],
             'input_shape': None if input_shape is None else tuple(map(int, input_shape))}
  kwargs.update({k: v for k, v in offered.items() if k in fields and v is not None})
  args = [f'{k}={v.__name__ if isinstance(v, type) else repr(v)}' for k, v in kwargs.items()]
  call = lambda *more: f"{row.model}({', '.join([*args, *more])})"   # noqa: E731
  if 'rngs' in fields:     # an NNX constructor: fresh params for every key
    make = functools.partial(factory, **kwargs)
    made = nnx.eval_shape(lambda: make(rngs=nnx.Rngs(0)))
    expect(isinstance(made, nnx.Module), 'model',
           f'{call("rngs=nnx.Rngs(...)")} to return a flax.nnx Module',
           _type_name(made), ConfigError)
    return model_lib.NNX.from_constructor(lambda rngs: make(rngs=rngs))
  model = factory(**kwargs)
  try:
    model_lib.as_model(model)
  except ConfigError:
    raise ConfigError(f'model: expected {call()} to return a flax.linen Module, a flax.nnx '
                      'Module or a purax model (purax.Functions, purax.nn.equinox.from_equinox, '
                      f'an object with init and apply), got {_type_name(model)}') from None
  return model


def _type_name(x) -> str:
  kind = type(x)
  name = kind.__qualname__
  return name if kind.__module__ == 'builtins' else f'{kind.__module__}.{name}'


def check_input_shape(model, shape: Sequence[int], field: str = 'x') -> None:
  """Checks that inputs of ``shape`` (``[batch, ...]``) suit ``model``.

  Raises:
    DataError: e.g. a CNN given ``[batch, features]`` instead of
      ``[batch, length, channels]`` or ``[batch, height, width, channels]``.
  """
  ranks = getattr(type(model), 'input_ranks', None)
  if ranks is None:
    expect(len(shape) >= 2, f'{field}.shape', '[batch, ...features]', tuple(shape))
    return
  expect(len(shape) in ranks, f'{field}.shape',
         f'[batch, length, channels] or [batch, height, width, channels] for '
         f'{type(model).__name__} (add a trailing channel axis of size 1 for '
         f'single-channel data)', tuple(shape))


def get_model(name: str, *, num_classes: int, **kwargs):
  """``MODELS[name].cls(num_classes=..., **kwargs)`` (``vocab_size=`` for a
  language model), for scripts and benchmarks that name a model.

  Raises:
    ConfigError: unknown name (the message lists the known ones).
  """
  expect(name in MODELS, 'model', f'one of {sorted(MODELS)}', repr(name), ConfigError)
  cls = MODELS[name].cls
  fields = {f.name for f in dataclasses.fields(cls)}
  return cls(**{'vocab_size' if 'vocab_size' in fields else 'num_classes': num_classes},
             **kwargs)
