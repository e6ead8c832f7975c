"""One embedding net written twice, as a Flax NNX module and as plain pure functions,
trained by the same Task recipe (the loss of own_model_contrastive.py) from the same
weights: the two runs agree. `PURAX_EXAMPLE_TINY=1`: a few steps."""
import os
import jax
import jax.numpy as jnp
from flax import nnx
import purax
from own_model_contrastive import digit_batches, supcon

STEPS = 4 if os.environ.get('PURAX_EXAMPLE_TINY') else 200
IN, WIDTH, DIM = 64, 128, 32

class Embed(nnx.Module):
  def __init__(self, rngs):
    self.hidden = nnx.Linear(IN, WIDTH, rngs=rngs)
    self.out = nnx.Linear(WIDTH, DIM, rngs=rngs)
  def __call__(self, x):                    # [batch, 8, 8, 1] -> [batch, DIM]
    return self.out(jax.nn.gelu(self.hidden(x.reshape(x.shape[0], -1))))

def embed_init(key, x):                     # the same parameter tree as the NNX module's
  k1, k2 = jax.random.split(key)
  lecun = jax.nn.initializers.lecun_normal()
  return {'hidden': {'kernel': lecun(k1, (IN, WIDTH)), 'bias': jnp.zeros((WIDTH,))},
          'out': {'kernel': lecun(k2, (WIDTH, DIM)), 'bias': jnp.zeros((DIM,))}}

def embed_apply(params, x):
  h = x.reshape(x.shape[0], -1) @ params['hidden']['kernel'] + params['hidden']['bias']
  return jax.nn.gelu(h) @ params['out']['kernel'] + params['out']['bias']

def train(model, batches, params):
  task = purax.Task(model=model, tx=purax.adamw(learning_rate=3e-3, total_steps=STEPS), loss=supcon)
  state = task.init(jax.random.key(0), batches[0])
  params = jax.tree.map(jnp.copy, params)   # fit donates the state: give each run its own copy
  state = state.replace(params=params, opt_state=task.tx.init(params))   # start from given weights
  state, history = purax.fit(task, state, batches, hooks=purax.hooks.standard(log_every=STEPS, progress=False))
  return state, history[-1]['train/loss']

if __name__ == '__main__':
  data = purax.io.datasets.load('digits')
  batches = digit_batches(data.x_train, data.y_train, STEPS)
  weights = embed_init(jax.random.key(1), None)
  nnx_state, nnx_loss = train(purax.NNX.from_constructor(Embed), batches, weights)
  fn_state, fn_loss = train(purax.Functions(embed_init, embed_apply), batches, weights)
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
             zip(jax.tree.leaves(nnx_state.params), jax.tree.leaves(fn_state.params)))
  print(f'nnx_and_functions: steps {STEPS}, NNX loss {nnx_loss:.6f}, functions loss {fn_loss:.6f}, '
        f'max |params difference| {diff:.2g}, agree {nnx_loss == fn_loss and diff == 0}')
