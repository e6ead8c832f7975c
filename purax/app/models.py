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
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal, Sequence

import tyro

from purax.core import lazy
from purax.core.errors import ConfigError, expect

# Used by the methods, not by the definitions (the parser reads those): imported on use.
precision_lib = lazy.module('purax.core.precision')
remat_lib = lazy.module('purax.nn.remat')
transformer_lib = lazy.module('purax.nn.transformer')


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A row of the table.

  Attributes:
    model: the flax.linen class, or its import path (``'purax.nn.mlp:MLP'``).
    help: one line for ``--help`` and the README.
    tokens: takes int32 token ids ``[batch, seq]`` and gives logits
      ``[batch, seq, vocab]`` (a language model: text data sets only).
  """

  model: type | str
  help: str
  tokens: bool = False

  @property
  def cls(self) -> type:
    """The flax.linen class (imported on first use when the row names it by path)."""
    return lazy.resolve(self.model)

  @property
  def fields(self) -> frozenset[str]:
    """The model class's fields."""
    return frozenset(f.name for f in dataclasses.fields(self.cls))

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


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model.

  Attributes:
    name: model name (a key of purax.app.models.MODELS).
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

  name: Annotated[Literal[tuple(MODELS)], tyro.conf.arg(name='model')] = 'cnn'
  dropout_rate: float = 0.0
  d_model: int | None = None
  num_layers: int | None = None
  num_heads: int | None = None
  remat: str = 'none'
  scan_layers: bool | None = None
  precision: str = 'auto'

  @property
  def spec(self) -> ModelSpec:
    return MODELS[self.name]

  def validate(self) -> 'ModelConfig':
    """Raises ConfigError naming the field, the expected and the actual value."""
    expect(self.name in MODELS, 'model', f'one of {sorted(MODELS)}', repr(self.name),
           ConfigError)
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
    return self

  def with_sizes(self) -> 'ModelConfig':
    """Sizes left unset taken from the model class's defaults, an unset
    ``scan_layers`` resolved by :func:`purax.nn.transformer.scans` and the
    precision by :func:`purax.core.precision.canonical` (``auto`` for this
    platform; one name per policy), so that a saved config records the
    parameter structure and precision trained (a later change of a model
    default, of the scan rule or of the platform cannot change what a saved
    run restores, and a resume elsewhere is compared with what it trained)."""
    defaults = {f.name: f.default for f in dataclasses.fields(self.spec.cls)}
    config = dataclasses.replace(self, **{k: defaults[k] for k in ('d_model', 'num_layers',
                                                                   'num_heads')
                                          if getattr(self, k) is None and k in defaults},
                                 precision=precision_lib.canonical(self.precision))
    if config.scan_layers is None and 'scan_layers' in defaults:
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


def build(config: ModelConfig, *, num_classes: int, seq_len: int | None = None):
  """The model of ``config`` for ``num_classes`` classes (a language model's
  vocabulary size) and, for a model with ``max_len``, sequences of ``seq_len``."""
  fields = {f.name for f in dataclasses.fields(config.spec.cls)}
  kwargs = {k: getattr(config, k) for k in OPTIONS
            if k in fields and getattr(config, k) is not None}
  kwargs.update(precision_lib.get_policy(config.precision).model_kwargs())
  kwargs['vocab_size' if 'vocab_size' in fields else 'num_classes'] = num_classes
  if 'max_len' in fields and seq_len is not None:
    kwargs['max_len'] = seq_len
  return config.spec.cls(**kwargs)


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
