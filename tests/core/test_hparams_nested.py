"""A hyperparameter injected at two depths (optax.inject_hyperparams inside a
chain inside another inject_hyperparams): purax.hyperparams reads the
outermost, the one that optax feeds its value to the transformation; and
set_hyperparams writes both."""

import jax
import numpy as np
import optax

import purax


def nested_state(outer=0.1, inner=0.5):
  tx = optax.inject_hyperparams(
      lambda learning_rate: optax.chain(
          optax.inject_hyperparams(optax.sgd)(learning_rate=inner),
          optax.scale(learning_rate)))(learning_rate=outer)
  task = purax.Task(model=purax.nn.MLP(num_classes=3, features=(4,)), tx=tx)
  rng = np.random.default_rng(0)
  batch = {'x': rng.normal(size=(4, 5)).astype(np.float32),
           'y': rng.integers(0, 3, 4).astype(np.int32)}
  return task.init(jax.random.key(0), batch)


def test_a_name_injected_twice_reads_the_outermost():
  state = nested_state(outer=0.1, inner=0.5)
  assert np.isclose(float(purax.hyperparams(state)['learning_rate']), 0.1)
  state = nested_state(outer=0.25, inner=0.75)
  assert np.isclose(float(purax.hyperparams(state)['learning_rate']), 0.25)


def test_set_writes_every_depth():
  state = purax.set_hyperparams(nested_state(), learning_rate=0.3)
  outer = state.opt_state
  inner = outer.inner_state[0]
  assert np.isclose(float(outer.hyperparams['learning_rate']), 0.3)
  assert np.isclose(float(inner.hyperparams['learning_rate']), 0.3)
