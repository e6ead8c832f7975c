"""Every model: output shape, compute dtype vs storage dtype, 1-D and 2-D inputs."""

import jax
import jax.numpy as jnp
import pytest

import purax
from purax import nn as pnn
from purax.app.models import check_input_shape, get_model

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
