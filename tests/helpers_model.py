"""What the tests of the model adapters share (tests/core/test_model.py,
tests/nn/test_equinox.py): one small MLP's shapes, its linen module, its
reference weights and batches, and a few jitted steps of a task."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import purax

IN, HIDDEN, OUT, STEPS = 4, 16, 3, 4


class LinenMLP(nn.Module):          # no `train` keyword: the adapter does not need one
  @nn.compact
  def __call__(self, x):
    h = jax.nn.relu(nn.Dense(HIDDEN)(x))
    return nn.Dense(OUT)(h)


def mlp_init(key, x):
  k1, k2 = jax.random.split(key)
  return {'hidden': {'kernel': jax.random.normal(k1, (x.shape[-1], HIDDEN)) * 0.3,
                     'bias': jnp.zeros((HIDDEN,))},
          'out': {'kernel': jax.random.normal(k2, (HIDDEN, OUT)) * 0.3, 'bias': jnp.zeros((OUT,))}}


def batches():
  rng = np.random.default_rng(0)
  return [{'x': rng.normal(size=(8, IN)).astype(np.float32),
           'y': rng.integers(0, OUT, 8).astype(np.int32)} for _ in range(STEPS)]


def reference_params():
  """The weights every variant starts from: {'hidden', 'out'} x {'kernel', 'bias'}."""
  return mlp_init(jax.random.key(42), batches()[0]['x'])


def train(task, state):
  step = jax.jit(task.step)
  for b in batches():
    state, metrics = step(state, b)
  return state, purax.metrics.compute(metrics)


def run_linen():
  task = purax.Task(model=LinenMLP(), tx=optax.adam(1e-2))
  state = task.init(jax.random.key(0), batches()[0])
  ref = reference_params()
  params = {'Dense_0': ref['hidden'], 'Dense_1': ref['out']}
  state = state.replace(params=params, opt_state=task.tx.init(params))
  state, m = train(task, state)
  return {'hidden': state.params['Dense_0'], 'out': state.params['Dense_1']}, m
