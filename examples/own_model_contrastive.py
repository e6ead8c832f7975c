"""An own flax.linen embedding net and supervised-contrastive loss on digits: a loss
hyperparameter (`temperature`, in `state.hparams`), an own metric (in-batch nearest-neighbour
accuracy), `purax.fit` over a list of batches, a 1-NN probe. `PURAX_EXAMPLE_TINY=1`: few steps."""
import os
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import purax

STEPS = 8 if os.environ.get('PURAX_EXAMPLE_TINY') else 300

class Embed(nn.Module):
  """Digits ``[batch, 8, 8, 1]`` -> embeddings ``[batch, 32]`` (a residual MLP)."""
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(128)(x.reshape(x.shape[0], -1))
    h = h + nn.Dense(128)(nn.gelu(nn.LayerNorm()(h)))
    return nn.Dense(32)(nn.gelu(nn.LayerNorm()(h)))

@purax.loss_function(hparams={'temperature': 0.1}, couples_examples=True)
def supcon(z, batch, hparams):
  """Supervised contrastive loss (Khosla et al. 2020) on ``z [batch, dim]``: every other
  example of the same class ``batch['y']`` is a positive. Returns values ``[batch]``."""
  z, y = z / jnp.linalg.norm(z, axis=-1, keepdims=True), jnp.asarray(batch['y'])
  self_mask = jnp.eye(z.shape[0], dtype=bool)
  sim = jnp.where(self_mask, -1e9, z @ z.T)
  positive = (y[:, None] == y[None, :]) & ~self_mask
  log_prob = jax.nn.log_softmax(sim / hparams['temperature'], axis=1)
  count = positive.sum(axis=1)
  values = -jnp.where(positive, log_prob, 0.0).sum(axis=1) / jnp.maximum(count, 1)
  nearest_same = y[jnp.argmax(sim, axis=1)] == y
  return values, (count > 0).astype(jnp.float32), {'nn_accuracy': nearest_same.astype(jnp.float32)}

def digit_batches(x, y, steps, batch_size=128, seed=0):
  """``steps`` batches ``{'x': float32 [b, 8, 8, 1], 'y': int32 [b]}`` drawn at random."""
  rng = np.random.default_rng(seed)
  rows = [rng.permutation(len(x))[:batch_size] for _ in range(steps)]
  return [{'x': x[i], 'y': y[i]} for i in rows]

def probe_accuracy(task, state, data):
  """Test accuracy of the label of the nearest train embedding (cosine)."""
  unit = lambda z: z / jnp.linalg.norm(z, axis=-1, keepdims=True)
  z_train, z_test = (unit(jax.jit(task.predict)(state, x)) for x in (data.x_train, data.x_test))
  nearest = np.asarray(jnp.argmax(z_test @ z_train.T, axis=1))
  return float(np.mean(data.y_train[nearest] == data.y_test))

if __name__ == '__main__':
  data = purax.io.datasets.load('digits')
  task = purax.Task(model=Embed(), tx=purax.adamw(learning_rate=3e-3, total_steps=STEPS),
                    loss=supcon, hparams={'temperature': 0.1})
  batches = digit_batches(data.x_train, data.y_train, STEPS)
  state = task.init(jax.random.key(0), batches[0])
  state, history = purax.fit(task, state, batches, hooks=purax.hooks.standard(log_every=50, progress=False, eval_data=[{'x': data.x_test, 'y': data.y_test}]))
  train = test = history[-1]          # the last log point: its window and the evaluation
  print(f"own_model_contrastive: steps {STEPS}, train loss {train['train/loss']:.4f}, "
        f"test in-batch nn_accuracy {test['eval/nn_accuracy']:.3f}, "
        f"test 1-NN probe accuracy {probe_accuracy(task, state, data):.3f}")
