"""purax.app.models, the model table: every model's output shape, compute
dtype vs storage dtype, 1-D and 2-D inputs; one row is all the CLI needs."""

import jax
import jax.numpy as jnp
import pytest

import purax
from purax import nn as pnn
from purax.app import models, runs
from purax.app.config import TrainConfig
from purax.app.models import check_input_shape, get_model
from purax.core.errors import ConfigError

SHAPES = {'mlp': [(2, 5), (2, 8, 8, 1)], 'cnn': [(2, 40, 1), (2, 8, 8, 1)],
          'resnet': [(2, 40, 1), (2, 8, 8, 1)]}


@pytest.mark.parametrize('name', sorted(SHAPES))
@pytest.mark.parametrize('dtype, param_dtype', [(jnp.float32, jnp.float32),
                                                (jnp.bfloat16, jnp.float32),
                                                (jnp.bfloat16, jnp.bfloat16)])
def test_models_separate_compute_and_storage_dtypes(name, dtype, param_dtype):
  model = get_model(name, num_classes=3, dtype=dtype, param_dtype=param_dtype)
  for shape in SHAPES[name]:
    x = jnp.ones(shape, jnp.float32)
    variables = jax.eval_shape(model.init, jax.random.key(0), x)
    assert all(p.dtype == param_dtype for p in jax.tree.leaves(variables['params']))
    out = jax.eval_shape(lambda v: model.apply(v, x, train=False), variables)
    assert out.shape == (2, 3) and out.dtype == dtype


def test_unknown_model_and_wrong_input_rank():
  with pytest.raises(purax.ConfigError, match=r"model: expected one of \['cnn', 'lm', 'mlp', 'resnet', 'transformer'\], got 'vit'"):
    get_model('vit', num_classes=2)
  with pytest.raises(purax.DataError, match=r'x.shape: expected \[batch, length, channels\]'):
    check_input_shape(pnn.CNN(num_classes=2), (4, 64))
  check_input_shape(pnn.MLP(num_classes=2), (4, 64))


def test_a_model_row_is_all_the_cli_needs(tmp_path, monkeypatch):
  import flax.linen as nn

  class Tiny(nn.Module):
    num_classes: int
    dropout_rate: float = 0.0
    dtype: object = None
    param_dtype: object = None

    @nn.compact
    def __call__(self, x, train=False):
      return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))

  monkeypatch.setitem(models.MODELS, 'tiny', models.ModelSpec(Tiny, 'a test model'))
  final = runs.train(TrainConfig.of(model='tiny', steps=3, batch_size=8, eval_every=0,
                                    workdir=str(tmp_path / 'r'), progress=False))
  assert final['examples'] == 360
  with pytest.raises(ConfigError, match=r'num_layers: expected unset for --model tiny'):
    TrainConfig.of(model='tiny', num_layers=2).validate()
