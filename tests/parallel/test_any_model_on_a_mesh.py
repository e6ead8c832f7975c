"""Every state field gets a sharding (derived from the fields: loss_scale too),
and models of any adapter run on the mesh and per-device paths."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import purax
from purax import parallel, testing


class Net(nnx.Module):
  def __init__(self, rngs):
    self.a = nnx.Linear(4, 16, rngs=rngs)
    self.b = nnx.Linear(16, 3, rngs=rngs)

  def __call__(self, x):
    return self.b(jax.nn.relu(self.a(x)))


def batches(n=2):
  rng = np.random.default_rng(0)
  return [{'x': rng.normal(size=(8, 4)).astype(np.float32),
           'y': rng.integers(0, 3, 8).astype(np.int32)} for _ in range(n)]


def test_a_loss_scaled_state_runs_sharded():
  task = purax.Task(model=purax.nn.MLP(num_classes=3, features=(16,)),
                    tx=purax.adamw(learning_rate=1e-3, total_steps=10), loss_scale=2.0 ** 15)
  mesh = testing.mesh_of({'data': 4})
  plan = parallel.sharded(task, mesh, parallel.data_parallel(), batches()[0])
  assert plan.state_sharding.loss_scale is not None
  state, m = plan.step(plan.init(jax.random.key(0)), plan.shard_batch(batches()[0]))
  assert float(state.loss_scale.scale) == 2.0 ** 15
  assert purax.metrics.compute(m)['skipped'] == 0


def test_an_nnx_model_on_a_mesh_and_per_device_equals_one_device():
  task = purax.Task(model=purax.NNX.from_constructor(Net), tx=optax.adam(1e-2))
  with jax.default_matmul_precision('highest'):
    testing.assert_step_matches_single_device(task, testing.mesh_of({'data': 4}),
                                              parallel.data_parallel(), batches())
    testing.assert_pmap_matches_jit(task, batches(), num_devices=4)


def test_logical_axes_need_a_linen_model():
  task = purax.Task(model=purax.NNX.from_constructor(Net), tx=optax.adam(1e-2))
  with pytest.raises(purax.ConfigError, match='model: expected a flax.linen module'):
    parallel.logical_axes(task, batches()[0])
