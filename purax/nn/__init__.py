"""purax.nn: flax.linen models. Every layer takes ``dtype`` (compute) and
``param_dtype`` (storage); models are called as ``model(x, train=bool)``."""

from purax.nn.cnn import CNN as CNN
from purax.nn.mlp import MLP as MLP
from purax.nn.resnet import ResNet as ResNet
from purax.nn.resnet import ResidualBlock as ResidualBlock
from purax.nn.generate import generate as generate
from purax.nn.transformer import DecoderLM as DecoderLM
from purax.nn.transformer import TransformerEncoder as TransformerEncoder

__all__ = [
    'CNN',
    'DecoderLM',
    'MLP',
    'ResNet',
    'ResidualBlock',
    'TransformerEncoder',
    'generate',
]
