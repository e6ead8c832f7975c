"""The gradients each parallel step applies equal the single-device gradient.

The optimizer records the gradient it receives in its state (``record``), so
what is compared is the gradient *inside* the step, after its all-reduce —
not a gradient recomputed beside it — against ``jax.grad`` of ``task.loss``
on the global batch on one device, an independent reference. A gradient
all-reduce off by the device count (a ``pmean`` for the ``psum``, or a
double sum) is off by a factor of 2 to 8 here, not by a tolerance.

Batches carry uneven weights (some 0). Tolerance: rtol 1e-5, atol 1e-7 at
``highest`` matmul precision (summation order only).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import purax
from purax import parallel


def record() -> optax.GradientTransformation:
  """An 'optimizer' that applies nothing and keeps the last gradient as its state."""
  return optax.GradientTransformation(
      lambda params: jax.tree.map(jnp.zeros_like, params),
      lambda updates, state, params=None: (jax.tree.map(jnp.zeros_like, updates), updates))


TASKS = {
    'mlp': purax.Task(model=purax.nn.MLP(num_classes=4, features=(16,)), tx=record()),
    'resnet': purax.Task(model=purax.nn.ResNet(num_classes=4, stage_features=(4,)),
                         tx=record()),
}


def _batch(shape):
  rng = np.random.default_rng(0)
  weight = rng.uniform(0.2, 1.0, 16).astype(np.float32)
  weight[[1, 6, 7]] = 0.0
  return {'x': rng.normal(size=(16, *shape)).astype(np.float32),
          'y': rng.integers(0, 4, 16).astype(np.int32), 'weight': weight}


SHAPES = {'mlp': (8,), 'resnet': (4, 1)}


def _reference(task, state, batch):
  loss = lambda p: task.compute_loss(p, state.model_state, batch, state.step_key(),   # noqa: E731
                                     hparams=state.hparams, train=True)[0]
  return jax.jit(jax.grad(loss))(state.params)


def _assert_close(got, want):
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7,
                               err_msg=jax.tree_util.keystr(path))


def _setup(name):
  task, batch = TASKS[name], _batch(SHAPES[name])
  state = jax.jit(task.init)(jax.random.key(0), batch)
  with jax.default_matmul_precision('highest'):
    want = _reference(task, state, batch)
  return task, batch, state, want


@pytest.mark.parametrize('rules', ['data_parallel', 'fsdp'])
def test_sharded_step_applies_the_single_device_gradient(rules):
  task, batch, _, want = _setup('mlp')
  mesh = parallel.make_mesh(data=4, fsdp=2)
  rules = parallel.data_parallel() if rules == 'data_parallel' else parallel.fsdp(min_size=16)
  plan = parallel.sharded(task, mesh, rules, batch)
  with jax.default_matmul_precision('highest'):
    state, _ = plan.step(plan.init(jax.random.key(0)), plan.shard_batch(batch))
  _assert_close(state.opt_state, want)


@pytest.mark.parametrize('name', ['mlp', 'resnet'])
def test_shard_map_step_applies_the_single_device_gradient(name):
  task, batch, state, want = _setup(name)
  mesh = parallel.make_mesh(data=4, devices=jax.devices()[:4])
  with jax.default_matmul_precision('highest'):
    new, _ = parallel.shard_map_step(task, mesh)(state, batch)
  _assert_close(new.opt_state, want)


@pytest.mark.parametrize('name', ['mlp', 'resnet'])
def test_pmap_step_applies_the_single_device_gradient(name):
  task, batch, state, want = _setup(name)
  step = parallel.pmap_step(task, devices=jax.devices()[:4])
  with jax.default_matmul_precision('highest'):
    new, _ = step(parallel.replicate(state, 4), parallel.split_batch(batch, 4))
  _assert_close(parallel.unreplicate(new.opt_state), want)
