"""Equinox models (purax.nn.equinox.from_equinox): an Equinox MLP trained by a
Task matches the same MLP in flax.linen (tests/core/test_model.py) to float32
rounding; a constructor draws from the key, and eqx.nn.BatchNorm's state is
the model_state, updated in training and frozen in evaluation."""

import jax
import numpy as np
import optax
import pytest

import purax
from purax import testing
from tests.helpers_model import HIDDEN, IN, OUT, batches, reference_params, run_linen, train


def test_equinox_trains_like_linen():
  eqx = pytest.importorskip('equinox')
  from purax.nn.equinox import from_equinox
  mlp = eqx.nn.MLP(IN, OUT, width_size=HIDDEN, depth=1, activation=jax.nn.relu,
                   key=jax.random.key(0))
  ref = reference_params()
  mlp = eqx.tree_at(lambda m: (m.layers[0].weight, m.layers[0].bias, m.layers[1].weight,
                               m.layers[1].bias), mlp,
                    (ref['hidden']['kernel'].T, ref['hidden']['bias'], ref['out']['kernel'].T,
                     ref['out']['bias']))
  task = purax.Task(model=from_equinox(mlp), tx=optax.adam(1e-2))
  state, m = train(task, task.init(jax.random.key(0), batches()[0]))
  linen, m_linen = run_linen()
  got = {'hidden': {'kernel': state.params.layers[0].weight.T, 'bias': state.params.layers[0].bias},
         'out': {'kernel': state.params.layers[1].weight.T, 'bias': state.params.layers[1].bias}}
  # Equinox computes W @ x per example (vmapped) rather than x @ W on the batch:
  # the same math in another summation order, so equal to float32 rounding.
  testing.assert_trees_close(got, linen, testing.Tolerance(rtol=1e-5, atol=1e-6), what='eqx')
  np.testing.assert_allclose(m['loss'], m_linen['loss'], rtol=1e-6)


def test_equinox_constructor_draws_from_the_key_and_batchnorm_state_is_carried():
  """Issue 27.4: init follows its key (vmapped over seeds: different members);
  eqx.nn.BatchNorm's state is model_state, updated to the batch's statistics
  and used frozen in evaluation."""
  eqx = pytest.importorskip('equinox')
  from purax.nn.equinox import from_equinox

  class Net(eqx.Module):
    lin: eqx.nn.Linear
    bn: eqx.nn.BatchNorm
    out: eqx.nn.Linear

    def __init__(self, key):
      k1, k2 = jax.random.split(key)
      self.lin = eqx.nn.Linear(IN, HIDDEN, key=k1)
      self.bn = eqx.nn.BatchNorm(HIDDEN, axis_name='batch', momentum=0.5, mode='batch')
      self.out = eqx.nn.Linear(HIDDEN, OUT, key=k2)

    def __call__(self, x, state, *, key=None):
      h, state = self.bn(jax.nn.relu(self.lin(x)), state)
      return self.out(h), state

  task = purax.Task(model=from_equinox(lambda key: eqx.nn.make_with_state(Net)(key)),
                    tx=optax.adam(1e-2))
  b = batches()[0]
  inits = jax.vmap(lambda k: task.init(k, b))(jax.random.split(jax.random.key(0), 2))
  kernels = inits.params.lin.weight
  assert not np.array_equal(kernels[0], kernels[1])     # two seeds, two members
  state = task.init(jax.random.key(3), b)
  stepped, _ = jax.jit(task.step)(state, b)
  # The running mean moved halfway (momentum 0.5) to the batch mean of relu(lin(x)).
  h = jax.nn.relu(b['x'] @ state.params.lin.weight.T + state.params.lin.bias[None])
  means = jax.tree.leaves(stepped.model_state)
  expected = 0.5 * 0 + 0.5 * np.asarray(h.mean(axis=0))
  assert any(m.shape == (HIDDEN,) and np.allclose(m, expected, atol=1e-5) for m in means)
  # Evaluation uses the running statistics and leaves them as they are.
  task.evaluate(stepped, b)
  assert all(np.array_equal(a, c) for a, c in zip(jax.tree.leaves(stepped.model_state), means))
