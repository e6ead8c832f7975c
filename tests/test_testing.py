"""purax.testing: the strategies draw what they promise, and the assertions
fail, naming the leaf, when a step is not the single-device step."""


import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import purax
from purax import parallel, testing


@given(sizes=testing.mesh_shapes(num_devices=8))
def test_mesh_shapes_use_a_divisor_of_the_devices(sizes):
  total = np.prod(list(sizes.values()))
  assert set(sizes) == set(parallel.AXES) and 8 % total == 0


@given(sizes=testing.mesh_shapes(num_devices=8, axes=('fsdp',)))
def test_mesh_shapes_restricted_axes(sizes):
  assert sizes['data'] == sizes['tensor'] == 1


@given(mesh=testing.meshes(), data=st.data())
def test_batch_sizes_divide_over_the_batch_axes(mesh, data):
  b = data.draw(testing.batch_sizes(mesh))
  assert b % (mesh.shape['data'] * mesh.shape['fsdp']) == 0
  b = data.draw(testing.batch_sizes(mesh, candidates=(8, 16)))
  assert b in (8, 16)


@given(batches=testing.classification_batches(6, (3, 2), 5, steps=2, weighted=True))
def test_classification_batches(batches):
  assert len(batches) == 2
  b = batches[0]
  assert b['x'].shape == (6, 3, 2) and b['x'].dtype == np.float32
  assert b['y'].dtype == np.int32 and b['y'].min() >= 0 and b['y'].max() < 5
  assert set(np.unique(b['weight'])) <= {0.0, 1.0} and b['weight'].sum() > 0


@given(tree=testing.small_pytrees())
def test_small_pytrees(tree):
  assert 1 <= len(tree) <= 4
  for x in tree.values():
    assert x.dtype == np.float32 and x.ndim <= 2 and all(d <= 8 for d in x.shape)


@settings(max_examples=5)
@given(tree=testing.small_pytrees())
def test_assert_trees_close_accepts_equal_rejects_perturbed(tree):
  testing.assert_trees_close(tree, dict(tree), testing.TOLERANCES['params'])
  name = sorted(tree)[0]
  bad = dict(tree, **{name: tree[name] + np.float32(1e-3)})
  with pytest.raises(AssertionError, match=rf"\['{name}'\]: max \|actual - expected\|"):
    testing.assert_trees_close(bad, tree, testing.TOLERANCES['params'], what='tree')


def test_assert_trees_close_checks_structure_shape_dtype():
  with pytest.raises(AssertionError, match='structure'):
    testing.assert_trees_close({'a': 1.0}, {'b': 1.0}, testing.TOLERANCES['loss'])
  with pytest.raises(AssertionError, match='shape'):
    testing.assert_trees_close({'a': np.zeros(2)}, {'a': np.zeros(3)}, testing.TOLERANCES['loss'])
  with pytest.raises(AssertionError, match='dtype'):
    testing.assert_trees_close({'a': np.zeros(2, np.float32)}, {'a': np.zeros(2)},
                               testing.TOLERANCES['loss'])


@purax.loss_function(hparams={'label_smoothing': 0.0})
def _first_half_loss(outputs, batch, hparams):
  """Drops the second half of the batch: right on one device, wrong when split."""
  values, _, metrics = purax.objectives.classification(outputs, batch, hparams)
  n = values.shape[0]
  return values, (np.arange(n) < n // 2).astype(np.float32), metrics


def test_assert_step_matches_single_device_catches_a_wrong_step():
  """The sharded run of the right task matches; a wrong sharded step is caught."""
  task = purax.Task(model=purax.nn.MLP(num_classes=4, features=(8,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=10))
  rng = np.random.default_rng(0)
  batches = [{'x': rng.normal(size=(8, 4)).astype(np.float32),
              'y': rng.integers(0, 4, 8).astype(np.int32)}]
  mesh = parallel.make_mesh(data=8)
  with jax.default_matmul_precision('highest'):
    testing.assert_step_matches_single_device(task, mesh, parallel.data_parallel(), batches)
    state = jax.jit(task.init)(jax.random.key(0), batches[0])
    broken = parallel.shard_map_step(
        purax.Task(model=task.model, tx=task.tx, loss=_first_half_loss), mesh)
    with pytest.raises(AssertionError, match='step 1 loss sum'):
      testing.assert_same_training(jax.jit(task.step), jax.tree.map(jax.numpy.copy, state),
                                   broken, state, batches)
