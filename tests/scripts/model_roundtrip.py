"""A run of one model kind saved, then restored and resumed in a fresh process
(tests/io/checkpoint/test_model_kinds.py).

usage: model_roundtrip.py KIND CHECKPOINT_DIR STOP_AT OUT.npz
  KIND: linen | nnx | functions | equinox (each with non-trainable state:
  batch statistics, or a step counter for the plain functions)
  STOP_AT 0: run to the end. Restores (or initialises) from CHECKPOINT_DIR,
  trains to STEPS (stopping after STOP_AT, a checkpoint saved), saves every
  leaf of the final state to OUT.npz and prints ``final step N``.
"""

import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

import purax
from purax.io.checkpoint import Checkpointer

STEPS, IN, HIDDEN, OUT = 6, 4, 8, 3


def batch(i):
  rng = np.random.default_rng(i)
  return {'x': rng.normal(size=(8, IN)).astype(np.float32),
          'y': rng.integers(0, OUT, 8).astype(np.int32)}


def linen():
  import flax.linen as nn

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
      h = nn.BatchNorm(use_running_average=not train, momentum=0.5)(nn.relu(nn.Dense(HIDDEN)(x)))
      return nn.Dense(OUT)(nn.Dropout(0.3, deterministic=not train)(h))
  return Net()


def nnx_model():
  from flax import nnx

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.lin = nnx.Linear(IN, HIDDEN, rngs=rngs)
      self.bn = nnx.BatchNorm(HIDDEN, momentum=0.5, rngs=rngs)
      self.drop = nnx.Dropout(0.3, rngs=rngs)
      self.out = nnx.Linear(HIDDEN, OUT, rngs=rngs)

    def __call__(self, x):
      return self.out(self.drop(self.bn(jax.nn.relu(self.lin(x)))))
  return purax.NNX.from_constructor(Net)


def init_fn(key, x):
  k1, k2 = jax.random.split(key)
  params = {'w1': jax.random.normal(k1, (IN, HIDDEN)) * 0.5,
            'w2': jax.random.normal(k2, (HIDDEN, OUT)) * 0.5}
  return params, {'calls': jnp.zeros((), jnp.int32)}


def apply_fn(params, state, x, *, train=False, rng=None):
  h = jnp.tanh(x @ params['w1'])
  if train and rng is not None:
    h = h * jax.random.bernoulli(rng, 0.7, h.shape) / 0.7
  return h @ params['w2'], {'calls': state['calls'] + (1 if train else 0)}


def functions():
  return purax.Functions(init_fn, apply_fn, stateful=True)


def equinox():
  import equinox as eqx
  from purax.nn.equinox import from_equinox

  class Net(eqx.Module):
    lin: eqx.nn.Linear
    bn: eqx.nn.BatchNorm
    drop: eqx.nn.Dropout
    out: eqx.nn.Linear

    def __init__(self, key):
      k1, k2 = jax.random.split(key)
      self.lin = eqx.nn.Linear(IN, HIDDEN, key=k1)
      self.bn = eqx.nn.BatchNorm(HIDDEN, axis_name='batch', momentum=0.5, mode='batch')
      self.drop = eqx.nn.Dropout(0.3)
      self.out = eqx.nn.Linear(HIDDEN, OUT, key=k2)

    def __call__(self, x, state, *, key=None):
      h, state = self.bn(jax.nn.relu(self.lin(x)), state)
      return self.out(self.drop(h, key=key)), state
  return from_equinox(lambda key: eqx.nn.make_with_state(Net)(key))


MODELS = {'linen': linen, 'nnx': nnx_model, 'functions': functions, 'equinox': equinox}


def main(kind, directory, stop_at, out):
  task = purax.Task(model=MODELS[kind](), tx=purax.adamw(learning_rate=1e-2, total_steps=STEPS))
  restored = purax.restore_or_init(directory, task, jax.random.key(0), batch(0))
  ckpt = Checkpointer(directory)
  steps = itertools.count(restored.step + 1)      # should_stop is polled after every step
  state, _ = purax.fit(task, restored, [batch(i) for i in range(STEPS)],
                       hooks=purax.hooks.standard(
                           log_every=1, progress=False, checkpointer=ckpt,
                           should_stop=lambda: bool(stop_at) and next(steps) >= stop_at))
  ckpt.close()
  state = jax.tree.map(lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(
      x.dtype, jax.dtypes.prng_key) else x, state)
  np.savez(out, **{jax.tree_util.keystr(p): np.asarray(x) for p, x in
                   jax.tree_util.tree_flatten_with_path(state)[0]})
  print(f'final step {int(state.step)}')


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
