"""The model interface: one MLP as flax.linen, Flax NNX, plain functions and
Equinox, trained by the same Task, gives bitwise-equal states on CPU."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import purax
from purax import testing
from tests.helpers import assert_bitwise

IN, HIDDEN, OUT, STEPS = 4, 16, 3, 4


class LinenMLP(nn.Module):          # no `train` keyword: the adapter does not need one
  @nn.compact
  def __call__(self, x):
    h = jax.nn.relu(nn.Dense(HIDDEN)(x))
    return nn.Dense(OUT)(h)


class NNXMLP(nnx.Module):
  def __init__(self, rngs):
    self.hidden = nnx.Linear(IN, HIDDEN, rngs=rngs)
    self.out = nnx.Linear(HIDDEN, OUT, rngs=rngs)

  def __call__(self, x):
    return self.out(jax.nn.relu(self.hidden(x)))


def mlp_init(key, x):
  k1, k2 = jax.random.split(key)
  return {'hidden': {'kernel': jax.random.normal(k1, (x.shape[-1], HIDDEN)) * 0.3,
                     'bias': jnp.zeros((HIDDEN,))},
          'out': {'kernel': jax.random.normal(k2, (HIDDEN, OUT)) * 0.3, 'bias': jnp.zeros((OUT,))}}


def mlp_apply(params, x):
  # the bias broadcast as flax writes it (rank promotion raises in this suite)
  h = jax.nn.relu(x @ params['hidden']['kernel'] + params['hidden']['bias'][None])
  return h @ params['out']['kernel'] + params['out']['bias'][None]


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


def run_nnx():
  module = NNXMLP(nnx.Rngs(0))
  ref = reference_params()
  for name in ('hidden', 'out'):
    getattr(module, name).kernel.value = ref[name]['kernel']
    getattr(module, name).bias.value = ref[name]['bias']
  task = purax.Task(model=module, tx=optax.adam(1e-2))     # adapted by purax.NNX.from_module
  state, m = train(task, task.init(jax.random.key(0), batches()[0]))
  return state.params, m


def run_functions():
  task = purax.Task(model=purax.Functions(mlp_init, mlp_apply), tx=optax.adam(1e-2))
  state = task.init(jax.random.key(0), batches()[0])
  state = state.replace(params=reference_params(), opt_state=task.tx.init(reference_params()))
  state, m = train(task, state)
  return state.params, m




def test_linen_nnx_and_functions_train_bitwise_alike():
  (linen, m_linen), (nnx_params, m_nnx), (fn, m_fn) = run_linen(), run_nnx(), run_functions()
  assert_bitwise(nnx_params, linen, 'nnx params')
  assert_bitwise(fn, linen, 'functions params')
  assert m_linen['loss'] == m_nnx['loss'] == m_fn['loss']
  # and they trained: the params moved away from the initial weights
  assert not np.array_equal(np.asarray(linen['out']['bias']), np.zeros(OUT))


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


def test_nnx_constructor_draws_from_the_key_and_keeps_batch_stats_and_dropout_pure():
  class Net(nnx.Module):
    def __init__(self, rngs):
      self.lin = nnx.Linear(IN, HIDDEN, rngs=rngs)
      self.bn = nnx.BatchNorm(HIDDEN, rngs=rngs)
      self.drop = nnx.Dropout(0.5, rngs=rngs)
      self.out = nnx.Linear(HIDDEN, OUT, rngs=rngs)

    def __call__(self, x):
      return self.out(self.drop(self.bn(jax.nn.relu(self.lin(x)))))

  task = purax.Task(model=purax.NNX.from_constructor(Net), tx=optax.adam(1e-2))
  b = batches()[0]
  s0, s1 = task.init(jax.random.key(0), b), task.init(jax.random.key(1), b)
  assert not np.array_equal(s0.params['lin']['kernel'], s1.params['lin']['kernel'])
  assert set(s0.model_state) == {'bn'}           # RNG streams are not state
  step = jax.jit(task.step)
  a, _ = step(s0, b)
  again, _ = step(task.init(jax.random.key(0), b), b)
  assert_bitwise(a, again, 'state')              # pure in (seed, step)
  assert not np.array_equal(a.model_state['bn']['mean'], s0.model_state['bn']['mean'])
  out0 = task.compute_loss(s0.params, s0.model_state, b, s0.step_key())[1]['outputs']
  out1 = task.compute_loss(s0.params, s0.model_state, b, a.step_key())[1]['outputs']
  assert not np.array_equal(out0, out1), 'the dropout mask follows the step key'
  e0, e1 = task.predict(s0, b), task.predict(s0, b['x'])
  np.testing.assert_array_equal(e0, e1)          # evaluation: deterministic


def test_a_model_that_fits_no_adapter_is_named():
  with pytest.raises(purax.ConfigError, match='model: expected a flax.linen Module'):
    purax.Task(model=lambda x: x, tx=optax.adam(1e-2))


def test_inputs_selector_reads_any_batch_pytree():
  model = purax.Linen(LinenMLP(), inputs=lambda b: b['views'][0])
  task = purax.Task(model=model, tx=optax.adam(1e-2))
  b = batches()[0]
  two_view = {'views': (b['x'], b['x'] + 1.0), 'y': b['y']}
  state, m = jax.jit(task.step)(task.init(jax.random.key(0), two_view), two_view)
  assert np.isfinite(purax.metrics.compute(m)['loss'])
  with pytest.raises(purax.DataError, match=r"batch\['x'\]: expected present"):
    purax.Task(model=LinenMLP(), tx=optax.adam(1e-2)).init(jax.random.key(0), two_view)


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
