"""purax.nn: flax.linen models. Every layer takes ``dtype`` (compute) and
``param_dtype`` (storage); models are called as ``model(x, train=bool)``."""

from purax.nn.cnn import CNN as CNN
from purax.nn.mlp import MLP as MLP
from purax.nn.registry import MODELS as MODELS
from purax.nn.registry import check_input_shape as check_input_shape
from purax.nn.registry import get_model as get_model
from purax.nn.resnet import ResNet as ResNet
from purax.nn.resnet import ResidualBlock as ResidualBlock
from purax.nn.generate import generate as generate
from purax.nn.transformer import DecoderLM as DecoderLM
from purax.nn.transformer import TransformerEncoder as TransformerEncoder
