"""Models by name, for the CLI and configs."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn

from purax.core.errors import ConfigError, expect
from purax.nn.cnn import CNN
from purax.nn.mlp import MLP
from purax.nn.resnet import ResNet
from purax.nn.transformer import DecoderLM, TransformerEncoder

MODELS = {'mlp': MLP, 'cnn': CNN, 'resnet': ResNet, 'transformer': TransformerEncoder,
          'lm': DecoderLM}


def get_model(name: str, *, num_classes: int, **kwargs) -> nn.Module:
  """Builds ``MODELS[name](num_classes=..., **kwargs)``.

  For ``'lm'`` (:class:`DecoderLM`) ``num_classes`` is the vocabulary size.

  Raises:
    ConfigError: unknown name (the message lists the known ones).
  """
  expect(name in MODELS, 'model', f'one of {sorted(MODELS)}', repr(name), ConfigError)
  if name == 'lm':
    return DecoderLM(vocab_size=num_classes, **kwargs)
  return MODELS[name](num_classes=num_classes, **kwargs)


def check_input_shape(model: nn.Module, shape: Sequence[int], field: str = 'x') -> None:
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
