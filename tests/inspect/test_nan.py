"""purax.inspect.nan.find on a NaN made in the backward pass only: the module
whose backward pass made it (the first non-finite cotangent), inside a
scanned stack the layer, for linen, NNX and Equinox; the step's own program
is the same with the replay available as without it."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
import pytest

import purax
from purax.core import model as model_lib
from purax.inspect import nan

LAYERS, BAD = 4, 2       # the layer whose 'root' takes a sqrt at 0


def batch():
  rng = np.random.default_rng(0)
  return {'x': rng.normal(size=(4, 6)).astype(np.float32),
          'y': rng.integers(0, 3, 4).astype(np.int32)}


def root(x, w):
  """sqrt(x² w): finite (0) forward where w = 0; its backward 0 · inf = NaN."""
  return jnp.sqrt(jnp.square(x) * w.reshape((1,) * (x.ndim - 1) + w.shape))


# -- linen: nn.scan over LAYERS blocks -----------------------------------------------


class Root(nn.Module):
  @nn.compact
  def __call__(self, h):
    return root(h, self.param('w', nn.initializers.ones, (h.shape[-1],)))


class Block(nn.Module):
  @nn.compact
  def __call__(self, h, _):
    return h + Root(name='root')(nn.Dense(8, name='dense')(h)), None


class LinenNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(8, name='embed')(x)
    h, _ = nn.scan(Block, variable_axes={'params': 0}, split_rngs={'params': True},
                   length=LAYERS)(name='layers')(h, None)
    return nn.Dense(3, name='head')(h)


def linen_task():
  task = purax.Task(model=LinenNet(), tx=optax.sgd(0.1))
  state = jax.jit(task.init)(jax.random.key(0), batch())
  params = jax.tree.map(lambda x: x, state.params)
  w = params['layers']['root']['w']
  params['layers']['root']['w'] = w.at[BAD].set(0.0)
  return task, state.replace(params=params)


# -- NNX: a stacked block under nnx.scan ---------------------------------------------


class NNXRoot(nnx.Module):
  def __init__(self):
    self.w = nnx.Param(jnp.ones((8,)))

  def __call__(self, h):
    return root(h, self.w.value)


class NNXBlock(nnx.Module):
  def __init__(self, rngs):
    self.dense = nnx.Linear(8, 8, rngs=rngs)
    self.root = NNXRoot()

  def __call__(self, h):
    return h + self.root(self.dense(h))


class NNXNet(nnx.Module):
  def __init__(self, rngs):
    self.embed = nnx.Linear(6, 8, rngs=rngs)

    @nnx.split_rngs(splits=LAYERS)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return NNXBlock(rngs)
    self.layers = make(rngs)
    self.head = nnx.Linear(8, 3, rngs=rngs)

  def __call__(self, x):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def body(h, block):
      return block(h)
    return self.head(body(self.embed(x), self.layers))


def nnx_task():
  task = purax.Task(model=purax.NNX.from_constructor(NNXNet), tx=optax.sgd(0.1))
  state = jax.jit(task.init)(jax.random.key(0), batch())
  params = jax.tree.map(lambda x: x, state.params)
  w = params['layers']['root']['w']
  params['layers']['root']['w'] = w.at[BAD].set(0.0)
  return task, state.replace(params=params)


# -- Equinox: jax.lax.scan over stacked blocks ---------------------------------------


def equinox_task():
  import equinox as eqx
  from purax.nn.equinox import from_equinox

  class EqxRoot(eqx.Module):
    w: jax.Array

    def __call__(self, h):
      return root(h, self.w)

  class EqxBlock(eqx.Module):
    dense: eqx.nn.Linear
    root: EqxRoot

    def __init__(self, key):
      self.dense, self.root = eqx.nn.Linear(8, 8, key=key), EqxRoot(jnp.ones((8,)))

    def __call__(self, h):
      return h + self.root(self.dense(h))

  class EqxNet(eqx.Module):
    embed: eqx.nn.Linear
    layers: EqxBlock
    head: eqx.nn.Linear

    def __init__(self, key):
      k = jax.random.split(key, 3)
      self.embed, self.head = eqx.nn.Linear(6, 8, key=k[0]), eqx.nn.Linear(8, 3, key=k[1])
      self.layers = eqx.filter_vmap(EqxBlock)(jax.random.split(k[2], LAYERS))

    def __call__(self, x, *, key=None):
      dynamic, static = eqx.partition(self.layers, eqx.is_array)

      def body(h, layer):
        return eqx.combine(layer, static)(h), None
      h, _ = jax.lax.scan(body, self.embed(x), dynamic)
      return self.head(h)

  task = purax.Task(model=from_equinox(EqxNet), tx=optax.sgd(0.1))
  state = jax.jit(task.init)(jax.random.key(0), batch())
  params = eqx.tree_at(lambda m: m.layers.root.w, state.params,
                       state.params.layers.root.w.at[BAD].set(0.0))
  return task, state.replace(params=params)


TASKS = {'linen': (linen_task, 'layers/root'), 'nnx': (nnx_task, 'layers/root'),
         'equinox': (equinox_task, 'layers/root')}


@pytest.mark.parametrize('kind', sorted(TASKS))
def test_a_nan_made_in_the_backward_pass_names_its_module_and_layer(kind):
  make, path = TASKS[kind]
  task, state = make()
  loss, _ = jax.jit(task.compute_loss)(state.params, state.model_state, batch(), None)
  assert np.isfinite(loss)                            # the forward pass is finite
  report = nan.find(task, state.replace(step=jnp.int32(9)), batch())
  assert (report.step, report.where, report.path) == (9, 'backward', path), str(report)
  assert f'layer {BAD} of 0..{LAYERS - 1}' in report.detail, report.detail
  assert 'the cotangent of its output is finite' in report.detail
  assert report.gradients                             # the parameter leaves, still listed


def test_the_step_is_the_same_program_with_the_replay_available_and_after_one():
  """Not replaying, the adapters trace nothing of the interceptor: the lowered
  step equals the one with the seam removed, before and after a replay."""
  task, state = linen_task()
  lowered = lambda: jax.jit(task.step).lower(state, batch()).as_text()
  available = lowered()
  nan.find(task, state, batch())
  after = lowered()
  with pytest.MonkeyPatch.context() as mp:
    import contextlib
    mp.setattr(model_lib, 'intercepted', lambda modules=None: contextlib.nullcontext())
    without = lowered()
  assert available == after == without
  assert 'callback' not in available and 'custom_vjp' not in available
