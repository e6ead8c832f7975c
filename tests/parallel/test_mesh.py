"""make_mesh / parse_mesh: shapes over the 8 host devices, and clear errors."""

import jax
import pytest
from hypothesis import given

from purax import ConfigError, parallel, testing


@given(testing.mesh_shapes(num_devices=8))
def test_make_mesh_fills_subset_devices_in_axis_order(sizes):
  mesh = testing.mesh_of(sizes)
  assert mesh.axis_names == parallel.AXES
  assert dict(mesh.shape) == sizes


def test_default_is_all_devices_on_data():
  mesh = parallel.make_mesh()
  assert dict(mesh.shape) == {'data': jax.device_count(), 'fsdp': 1, 'tensor': 1}


@pytest.mark.parametrize('kwargs, expected', [
    (dict(data=-1, fsdp=2), {'data': 4, 'fsdp': 2, 'tensor': 1}),
    (dict(fsdp=-1), {'data': 1, 'fsdp': 8, 'tensor': 1}),
    (dict(data=2, tensor=-1), {'data': 2, 'fsdp': 1, 'tensor': 4}),
])
def test_one_axis_may_be_the_rest(kwargs, expected):
  assert dict(parallel.make_mesh(**kwargs).shape) == expected


@pytest.mark.parametrize('kwargs, match', [
    (dict(data=3), r'mesh: expected axis sizes multiplying to the 8 devices.*got data=3'),
    (dict(data=2, fsdp=2), r'got data=2 x fsdp=2 x tensor=1 = 4'),
    (dict(data=-1, fsdp=3), r'mesh.data: .*multiply to 3, which does not divide 8'),
    (dict(data=-1, fsdp=-1), r'at most one axis of size -1'),
    (dict(data=0), r'mesh.data: expected a positive int or -1 .*got 0'),
])
def test_bad_mesh_names_expected_and_actual(kwargs, match):
  with pytest.raises(ConfigError, match=match):
    parallel.make_mesh(**kwargs)


def test_parse_mesh():
  assert parallel.parse_mesh('data=4,fsdp=2') == {'data': 4, 'fsdp': 2}
  assert parallel.parse_mesh(' tensor=-1 ') == {'tensor': -1}
  with pytest.raises(ConfigError, match=r"mesh axis: expected one of .*got 'model'"):
    parallel.parse_mesh('model=2')
  with pytest.raises(ConfigError, match=r"expected 'AXIS=SIZE"):
    parallel.parse_mesh('data:4')
  with pytest.raises(ConfigError, match='repeated'):
    parallel.parse_mesh('data=2,data=4')
