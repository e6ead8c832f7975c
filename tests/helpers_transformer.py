"""What the tests of the transformers share (tests/nn/test_transformer.py,
test_generate.py, test_remat.py): tiny shapes (d_model 32, 2 layers, seq 16),
random tokens, the LM's parameters (cached per model) and a jitted apply."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

SEQ, BATCH = 16, 2
LM = dict(d_model=32, num_layers=2, num_heads=4, max_len=SEQ)


def tokens(seed=0, shape=(BATCH, SEQ)):
  return jax.random.randint(jax.random.key(seed), shape, 0, 256, jnp.int32)


def lm_params(model, x=None):
  if x is None:
    return _params(model)
  return nn.unbox(jax.jit(model.init)(jax.random.key(0), x))['params']


@functools.lru_cache(maxsize=None)
def _params(model):
  return nn.unbox(jax.jit(model.init)(jax.random.key(0), tokens()))['params']


def jit_apply(model):
  return jax.jit(model.apply, static_argnames=('train', 'decode', 'mutable'))
