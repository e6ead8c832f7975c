"""A model for ``purax train --model tests.scripts.backward_nan_net:make_net``
whose backward pass alone makes a NaN (tests/app/test_debug_nan_backward.py):
a scanned stack of LAYERS blocks; in layer BAD the module ``root`` takes
``sqrt(h² · 0)`` for an example whose first feature exceeds MARK: 0 forward,
``0 · inf`` = NaN in its backward pass."""

import flax.linen as nn
import jax.numpy as jnp

LAYERS, BAD, MARK = 4, 2, 50.0


class Root(nn.Module):
  @nn.compact
  def __call__(self, h, off):
    return jnp.sqrt(jnp.square(h) * jnp.where(off, 0.0, 1.0)[:, None])


class Block(nn.Module):
  @nn.compact
  def __call__(self, carry, _):
    h, layer, marked = carry
    h = h + Root(name='root')(nn.tanh(nn.Dense(8, name='dense')(h)), marked & (layer == BAD))
    return (h, layer + 1, marked), None


class Net(nn.Module):
  num_classes: int

  @nn.compact
  def __call__(self, x):
    x = x.reshape(x.shape[0], -1)
    carry = (nn.Dense(8, name='embed')(x), jnp.zeros((), jnp.int32), x[:, 0] > MARK)
    (h, _, _), _ = nn.scan(Block, variable_axes={'params': 0}, split_rngs={'params': True},
                           length=LAYERS)(name='layers')(carry, None)
    return nn.Dense(self.num_classes, name='head')(h)


def make_net(num_classes):
  return Net(num_classes)
