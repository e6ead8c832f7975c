"""A model whose layer makes a NaN for marked examples (its first feature
above ``MARK``): the non-finite tests of tests/core and tests/hooks."""

import flax.linen as nn
import jax.numpy as jnp

MARK = 50.0     # an example whose first feature exceeds it gets NaN from 'block'


class Poisoned(nn.Module):
  """Finite inner layer, then NaN for marked examples: its own code makes it."""

  @nn.compact
  def __call__(self, h, x):
    h = nn.Dense(8, name='inner')(h)
    return jnp.where(x[:, :1] > MARK, jnp.nan, h)


class LinenNet(nn.Module):
  between: bool = False     # NaN made by this module's code between two calls

  @nn.compact
  def __call__(self, x):
    h = Poisoned(name='block')(nn.Dense(8, name='encoder')(x), x) if not self.between else \
        jnp.log(nn.Dense(8, name='encoder')(x) - 1e3)
    return nn.Dense(3, name='head')(h)
