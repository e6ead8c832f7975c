"""purax.io.checkpoint.integrity: a leaf's fingerprint sees one flipped bit
and a transposition but not the sharding, and the numpy fingerprint of a
small leaf is the device program's bit for bit."""

import jax
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from purax.io.checkpoint import fingerprints, integrity


def test_fingerprints_see_one_bit_and_not_the_sharding():
  x = np.arange(64, dtype=np.float32).reshape(8, 8)
  flipped = x.view(np.uint32).copy()
  flipped[3, 5] ^= 1
  mesh = jax.make_mesh((8,), ('data',))
  sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
      'data')))
  tree = {'x': x, 'h': x.astype(jax.numpy.bfloat16), 'b': x > 3, 'k': jax.random.key(1)}
  base = fingerprints(tree)
  assert fingerprints({**tree, 'x': sharded}) == base
  assert fingerprints({**tree, 'x': flipped.view(np.float32)})[3] != base[3]
  assert fingerprints({**tree, 'x': x.T.copy()})[3] != base[3]     # positions count
  assert len(set(base)) == len(base)


@given(dtype=st.sampled_from(sorted(integrity._HOST_DTYPES, key=str)),
       shape=st.sampled_from([(), (0,), (7,), (3, 5)]), seed=st.integers(0, 2 ** 16))
def test_the_host_fingerprint_is_the_device_fingerprint_bit_for_bit(dtype, shape, seed):
  # Any bits, NaN payloads and negative zeros included.
  raw = np.random.default_rng(seed).integers(0, 256, (int(np.prod(shape)), dtype.itemsize),
                                             dtype=np.uint8)
  x = raw.view(dtype)[:, 0].reshape(shape)
  device = jax.device_get(integrity._fingerprints_on_device([x]))[0]
  np.testing.assert_array_equal(integrity._host_fingerprint(x), device)


def test_large_and_bool_leaves_are_fingerprinted_on_the_device_and_agree_with_numpy():
  x = np.random.default_rng(0).standard_normal((640, 512)).astype(np.float32)   # 1.25 MiB
  assert x.nbytes > integrity.HOST_LEAF_BYTES
  flags = np.array([True, False, True])
  for leaf in (x, jax.device_put(x), flags, jax.device_put(flags)):
    assert not integrity._on_host(leaf)
  small = jax.device_put(x[:8])
  assert integrity._on_host(small) and integrity._on_host(x[:8])
  by_numpy = [integrity._host_fingerprint(a) for a in (x, x[:8], flags.view(np.uint8))]
  assert fingerprints([x, small, flags]) == [f'{int(a):08x}{int(b):08x}' for a, b in by_numpy]
