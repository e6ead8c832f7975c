"""purax.testing.strategies: the strategies draw what they promise."""

import numpy as np
from hypothesis import given, strategies as st

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
