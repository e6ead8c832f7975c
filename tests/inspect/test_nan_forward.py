"""purax.inspect.nan.find: a replayed update names its first non-finite
value — the layer whose forward pass made it (linen, NNX, Equinox), the code
around a call, the batch, a hyperparameter, or the parameter whose gradient
is not finite — with the update's step."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import purax
from purax.inspect import nan as nonfinite
from tests.helpers import with_hyperparam
from tests.helpers_nonfinite import MARK, LinenNet


def batch(marked=False, nan_input=False):
  rng = np.random.default_rng(0)
  b = {'x': rng.normal(size=(4, 5)).astype(np.float32),
       'y': rng.integers(0, 3, 4).astype(np.int32)}
  if marked:
    b['x'][2, 0] = 2 * MARK
  if nan_input:
    b['x'][1, 3] = np.nan
  return b


class NNXBlock(nnx.Module):
  def __init__(self, rngs):
    self.inner = nnx.Linear(8, 8, rngs=rngs)

  def __call__(self, h, x):
    return jnp.where(x[:, :1] > MARK, jnp.nan, self.inner(h))


class NNXNet(nnx.Module):
  def __init__(self, rngs):
    self.encoder = nnx.Linear(5, 8, rngs=rngs)
    self.block = NNXBlock(rngs)
    self.head = nnx.Linear(8, 3, rngs=rngs)

  def __call__(self, x):
    return self.head(self.block(self.encoder(x), x))


def equinox_model():
  import equinox as eqx
  from purax.nn.equinox import from_equinox

  class Block(eqx.Module):
    inner: eqx.nn.Linear

    def __init__(self, key):
      self.inner = eqx.nn.Linear(8, 8, key=key)

    def __call__(self, h, x):     # one example (the adapter vmaps)
      return jnp.where(x[0] > MARK, jnp.nan, self.inner(h))

  class Net(eqx.Module):
    encoder: eqx.nn.Linear
    block: Block
    head: eqx.nn.Linear

    def __init__(self, key):
      k = jax.random.split(key, 3)
      self.encoder, self.block = eqx.nn.Linear(5, 8, key=k[0]), Block(k[1])
      self.head = eqx.nn.Linear(8, 3, key=k[2])

    def __call__(self, x, *, key=None):
      return self.head(self.block(self.encoder(x), x))

  return from_equinox(Net)


MODELS = {'linen': LinenNet, 'nnx': lambda: purax.NNX.from_constructor(NNXNet),
          'equinox': equinox_model}


def task_of(model):
  return purax.Task(model=model, tx=optax.sgd(0.1))


@pytest.mark.parametrize('kind', sorted(MODELS))
def test_a_nan_made_in_a_layers_forward_pass_is_named_with_its_step(kind):
  task = task_of(MODELS[kind]())
  state = jax.jit(task.init)(jax.random.key(0), batch())
  report = nonfinite.find(task, state.replace(step=jnp.int32(41)), batch(marked=True))
  assert (report.step, report.where, report.path) == (41, 'forward', 'block'), str(report)
  assert 'holds 8 NaN and 0 inf, from finite inputs' in report.detail
  assert report.gradients and all('head' in g for g in report.gradients)
  assert str(report).startswith('update at state.step=41: forward: block: its output')
  assert nonfinite.Report.from_dict(report.as_dict()) == report


class Gate(nn.Module):
  @nn.compact
  def __call__(self, x):
    s = self.param('scale', nn.initializers.zeros, (1,))
    return x * jnp.sqrt(s)[None, :]   # sqrt(0) = 0 forward; its derivative is inf


class GatedNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(8, name='encoder')(x)
    return nn.Dense(3, name='head')(h + Gate(name='gate')(h))


def test_an_inf_gradient_through_a_sqrt_at_zero_names_that_parameter():
  task = task_of(GatedNet())
  state = jax.jit(task.init)(jax.random.key(0), batch())
  report = nonfinite.find(task, state.replace(step=jnp.int32(7)), batch())
  assert (report.step, report.where, report.path) == (7, 'backward', "['gate']['scale']"), \
      str(report)
  assert report.gradients == ("['gate']['scale']",)     # per leaf: only that one
  assert 'the forward pass and the loss being finite' in report.detail


def test_the_code_around_a_call_the_batch_a_hyperparameter_and_a_finite_replay():
  task = task_of(LinenNet(between=True))
  state = jax.jit(task.init)(jax.random.key(0), batch())
  around = nonfinite.find(task, state, batch())
  assert (around.where, around.path) == ('forward', '(the model)'), str(around)
  assert 'before it called head' in around.detail
  task = task_of(LinenNet())
  state = jax.jit(task.init)(jax.random.key(0), batch())
  data = nonfinite.find(task, state, batch(nan_input=True))
  assert (data.where, data.path) == ('batch', "batch['x']") and '1 NaN' in data.detail
  adamw = purax.Task(model=LinenNet(), tx=purax.adamw(learning_rate=1e-2, total_steps=10))
  hp = with_hyperparam(adamw.init(jax.random.key(0), batch()), 'learning_rate', np.nan)
  report = nonfinite.find(adamw, hp, batch())
  assert (report.where, report.path) == ('hyperparameter', 'learning_rate'), str(report)
  assert nonfinite.find(task, state, batch()).where == 'none'
  with pytest.raises(purax.ConfigError, match='state: expected a purax.TrainState'):
    nonfinite.find(task, {'params': state.params}, batch())


def test_a_nan_inside_a_scanned_rematerialised_layer_names_the_layer_and_its_iteration():
  """The layers of the decoder under nn.scan (one traced body for all) and
  remat: the second layer's MLP weights hold a NaN; the report names the
  scanned module and the iteration (run) where it first appears."""
  model = purax.nn.DecoderLM(vocab_size=16, d_model=8, num_layers=2, num_heads=2, max_len=8,
                             scan_layers=True, remat='full')
  task = purax.Task(model=model, tx=optax.sgd(0.1), loss=purax.objectives.language_model)
  tokens = np.random.default_rng(0).integers(0, 16, (2, 9)).astype(np.int32)
  lm_batch = {'x': tokens[:, :-1], 'y': tokens[:, 1:]}
  state = jax.jit(task.init)(jax.random.key(0), lm_batch)
  params = jax.tree.map(lambda x: x, state.params)
  params['layers']['mlp']['wi'] = params['layers']['mlp']['wi'].at[1].set(jnp.nan)
  report = nonfinite.find(task, state.replace(params=params), lm_batch)
  assert (report.where, report.path) == ('forward', 'layers/mlp'), str(report)
  assert 'first in run 2 of its 2' in report.detail
