"""Gradient checkpointing (purax.nn.remat): a transformer whose every block is
recomputed in the backward pass has the gradients of the one that stores its
activations (scanned and unrolled). A remat policy's name is checked in
tests/nn/test_transformer.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from purax.nn.transformer import DecoderLM
from tests.helpers_transformer import LM, lm_params, tokens


@pytest.mark.parametrize('scan_layers', [True, False])
def test_remat_gives_the_same_gradients(scan_layers):
  model = DecoderLM(**LM, scan_layers=scan_layers)
  params = lm_params(model)
  x = tokens(6)

  def grads(m):
    return jax.jit(jax.grad(lambda p: jnp.mean(m.apply({'params': p}, x) ** 2)))(params)

  with jax.default_matmul_precision('highest'):
    expected = grads(model)
    actual = grads(model.clone(remat='full'))   # recompute every block in the backward pass
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(actual)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
