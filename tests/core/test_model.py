"""The model interface: one MLP as flax.linen, Flax NNX and plain functions,
trained by the same Task, gives bitwise-equal states on CPU (Equinox:
tests/nn/test_equinox.py)."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import purax
from tests.helpers import assert_bitwise
from tests.helpers_model import (
  HIDDEN,
  IN,
  OUT,
  LinenMLP,
  batches,
  mlp_init,
  reference_params,
  run_linen,
  train,
)


class NNXMLP(nnx.Module):
  def __init__(self, rngs):
    self.hidden = nnx.Linear(IN, HIDDEN, rngs=rngs)
    self.out = nnx.Linear(HIDDEN, OUT, rngs=rngs)

  def __call__(self, x):
    return self.out(jax.nn.relu(self.hidden(x)))


def mlp_apply(params, x):
  # the bias broadcast as flax writes it (rank promotion raises in this suite)
  h = jax.nn.relu(x @ params['hidden']['kernel'] + params['hidden']['bias'][None])
  return h @ params['out']['kernel'] + params['out']['bias'][None]


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
