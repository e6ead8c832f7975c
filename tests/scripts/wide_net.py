"""A model whose step needs much memory for little work (``--model
tests.scripts.wide_net:make``): each example's 64 features are spread to
``[64, WIDTH]`` (a product with a learned vector), passed through tanh and
reduced by a matmul, so the step's temporaries grow with the batch
(``64 * WIDTH * 4`` bytes an example, 4 MiB) while its FLOPs stay
small. Used to run a step out of memory on purpose (tests/app/test_oom_refit.py)."""

import flax.linen as nn
import jax.numpy as jnp

#: Columns each feature is spread to.
WIDTH = 2 ** 14


class Wide(nn.Module):
  num_classes: int

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(64)(x.reshape(x.shape[0], -1))                       # [B, 64]
    spread = self.param('spread', nn.initializers.normal(1.0), (WIDTH,))
    big = jnp.tanh(x[:, :, None] * spread[None, None, :])                 # [B, 64, WIDTH]
    mix = self.param('mix', nn.initializers.normal(WIDTH ** -0.5), (WIDTH, 1))
    h = (big @ mix).reshape(x.shape[0], -1)                            # [B, 64]
    return nn.Dense(self.num_classes)(h)


def make(num_classes: int) -> nn.Module:
  return Wide(num_classes=num_classes)
