"""The per-device paths: pmap equals jit, shard_map equals the single device,
BatchNorm averages over the mapped axis, dropout keys differ per device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import purax
from purax import DataError, parallel, testing

MLP = purax.Task(model=purax.nn.MLP(num_classes=4, features=(16,)),
                 tx=purax.adamw(learning_rate=1e-2, total_steps=10))
RESNET = purax.Task(model=purax.nn.ResNet(num_classes=4, stage_features=(4,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=10))


@settings(max_examples=2)
@given(task=st.sampled_from([MLP, RESNET]), data=st.data())
def test_pmap_equals_jit(task, data):
  batches = data.draw(testing.classification_batches(16, (4, 1), 4, steps=2))
  with jax.default_matmul_precision('highest'):
    testing.assert_pmap_matches_jit(task, batches, num_devices=8)


@settings(max_examples=2)
@given(sizes=st.sampled_from([{'data': 8, 'fsdp': 1, 'tensor': 1},
                              {'data': 2, 'fsdp': 2, 'tensor': 2}]),
       weighted=st.booleans(), data=st.data())
def test_shard_map_step_equals_single_device(sizes, weighted, data):
  """BatchNorm (axis_name over the batch axes) and uneven weights included."""
  mesh = testing.mesh_of(sizes)
  batches = data.draw(testing.classification_batches(16, (4, 1), 4, steps=2,
                                                     weighted=weighted))
  with jax.default_matmul_precision('highest'):
    state = jax.jit(RESNET.init)(jax.random.key(0), batches[0])
    testing.assert_same_training(jax.jit(RESNET.step), jax.tree.map(jnp.copy, state),
                                 parallel.shard_map_step(RESNET, mesh), state, batches)


def test_pmap_draws_a_distinct_dropout_mask_per_device():
  task = purax.Task(model=purax.nn.MLP(num_classes=4, features=(64,), dropout_rate=0.5),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=10))
  x = np.ones((4, 8), np.float32)
  batch = {'x': np.tile(x, (2, 1)), 'y': np.zeros((8,), np.int32)}
  state = task.init(jax.random.key(0), batch)

  def grads(state, batch):   # per-device gradients, before any psum
    key = jax.random.fold_in(state.step_key(), jax.lax.axis_index('batch'))
    return jax.grad(lambda p: task.compute_loss(p, {}, batch, key)[0])(state.params)

  g = jax.pmap(grads, axis_name='batch', devices=jax.devices()[:2])(
      parallel.replicate(state, 2), parallel.split_batch(batch, 2))
  kernel = g['Dense_0']['kernel']
  assert not np.allclose(kernel[0], kernel[1])   # same inputs, different masks
  new, _ = parallel.pmap_step(task, devices=jax.devices()[:2])(
      parallel.replicate(state, 2), parallel.split_batch(batch, 2))
  np.testing.assert_array_equal(new.params['Dense_0']['kernel'][0],
                                new.params['Dense_0']['kernel'][1])   # still replicated
  assert (jax.random.key_data(new.rng[0]) == jax.random.key_data(state.rng)).all()


def test_with_axis_name_sets_batchnorm_axis_only_where_supported():
  assert parallel.with_axis_name(RESNET, 'batch').model.axis_name == 'batch'
  assert parallel.with_axis_name(MLP, 'batch').model == MLP.model


def test_split_batch_errors():
  with pytest.raises(DataError, match=r"batch\['x'\].shape\[0\]: expected a multiple of 8 "
                     r"\(devices\), got 12"):
    parallel.split_batch({'x': np.zeros((12, 2))}, 8)
  step = parallel.shard_map_step(MLP, parallel.make_mesh())
  with pytest.raises(DataError, match='expected a multiple of 8'):
    step(None, {'x': np.zeros((12, 2)), 'y': np.zeros((12,), np.int32)})
