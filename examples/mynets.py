"""Your own model, loss and data for the command line (cli_own_model.py runs them):

  purax train --model mynets:make_net --loss mynets:focal --dataset mynets:blobs

run where this file is, or with its directory on PYTHONPATH. `make_net` is called
with the keywords it names (num_classes; input_shape, rngs, dtype, dropout_rate, ...:
purax.app.models); `focal` follows the loss contract of purax.core.objectives;
`blobs` returns (x_train, y_train, x_test, y_test) (purax.io.datasets.from_function).
"""
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
import purax


class Net(nn.Module):
  num_classes: int
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, x, train: bool = False):   # x: [batch, ...features]
    x = nn.gelu(nn.Dense(64)(x.reshape(x.shape[0], -1)))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)          # logits [batch, num_classes]


def make_net(num_classes: int, dropout_rate: float = 0.1) -> Net:
  return Net(num_classes=num_classes, dropout_rate=dropout_rate)


@purax.loss_function(hparams={'gamma': 2.0})
def focal(logits, batch, hparams):
  """Focal loss (Lin et al. 2017): cross-entropy down-weighted where p is high."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch['y'])   # [batch]
  p = jnp.exp(-ce)                                                          # p of the label
  values = (1 - p) ** hparams['gamma'] * ce
  accuracy = (logits.argmax(-1) == batch['y']).astype(jnp.float32)
  return values, batch.get('weight'), {'accuracy': accuracy}


def blobs(n: int = 1200, classes: int = 4):
  """Four Gaussian blobs in 2-D, 1,000 examples to train and 200 to test."""
  rng = np.random.default_rng(0)
  y = rng.integers(0, classes, n).astype(np.int32)
  angle = 2 * np.pi * y / classes
  x = np.stack([np.cos(angle), np.sin(angle)], 1) * 2 + rng.normal(size=(n, 2))
  return x[:1000].astype(np.float32), y[:1000], x[1000:].astype(np.float32), y[1000:]
