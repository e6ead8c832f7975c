import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from purax import loop
from purax.core import metrics
from purax.io import pipeline
from tests.helpers import tiny_batch, tiny_task

TASK = tiny_task('mlp', classes=5)
STATE = TASK.init(jax.random.key(0), tiny_batch(n=4, shape=(3,), classes=5))


@settings(max_examples=12)
@given(n=st.sampled_from([1, 5, 13, 32]), batch_size=st.sampled_from([1, 4, 8, 40]))
def test_evaluation_counts_each_example_once_and_equals_the_unbatched_metric(n, batch_size):
  data = tiny_batch(n=n, shape=(3,), classes=5, seed=n)
  batches = pipeline.eval_batches(data['x'], data['y'], batch_size=batch_size)
  assert sum(float(b['weight'].sum()) for b in batches) == n
  assert len({b['x'].shape for b in batches}) == 1   # fixed shape: one compilation
  got = loop.evaluate(TASK, STATE, batches)
  whole = metrics.compute(TASK.evaluate(STATE, data))
  assert got['examples'] == n
  np.testing.assert_allclose(got['loss'], whole['loss'], rtol=1e-5)
  np.testing.assert_allclose(got['accuracy'], whole['accuracy'], rtol=1e-6)


def test_train_batches_cover_each_epoch_and_reshuffle():
  x = np.arange(10, dtype=np.float32)[:, None]
  y = np.arange(10, dtype=np.int32)
  ds = pipeline.train_dataset(x, y, batch_size=5, seed=0, num_steps=6)
  assert len(ds) == 6
  epochs = [np.concatenate([ds[2 * e]['y'], ds[2 * e + 1]['y']]) for e in range(3)]
  for e in epochs:
    assert sorted(e) == list(range(10))
  assert not np.array_equal(epochs[0], epochs[1])
  # Random access by step is a pure function of (seed, step): resume is exact.
  again = pipeline.train_dataset(x, y, batch_size=5, seed=0, num_steps=6)
  assert all(np.array_equal(ds[s]['y'], again[s]['y']) for s in range(6))
  other = pipeline.train_dataset(x, y, batch_size=5, seed=1, num_steps=6)
  assert not all(np.array_equal(ds[s]['y'], other[s]['y']) for s in range(6))
  np.testing.assert_array_equal(ds[3]['x'][:, 0], ds[3]['y'])


def test_prefetch_yields_device_arrays_in_order():
  batches = [{'x': np.full((2,), i, np.float32)} for i in range(5)]
  out = list(pipeline.prefetch_to_device(batches, size=2))
  assert [int(b['x'][0]) for b in out] == list(range(5))
  assert all(isinstance(b['x'], jax.Array) for b in out)


def test_a_batch_that_crosses_an_epoch_boundary_takes_the_next_epochs_permutation():
  """Issue 27.7: 10 examples, batches of 4: step 2 holds the last 2 of epoch 0's
  permutation and the first 2 of epoch 1's (not epoch 0's again)."""
  x = np.arange(10, dtype=np.float32)[:, None]
  y = np.arange(10, dtype=np.int32)
  ds = pipeline.train_dataset(x, y, batch_size=4, seed=3, num_steps=5)
  perm = lambda epoch: np.random.default_rng([3, epoch]).permutation(10)   # noqa: E731
  np.testing.assert_array_equal(ds[2]['y'], np.concatenate([perm(0)[8:], perm(1)[:2]]))
  np.testing.assert_array_equal(ds[3]['y'], perm(1)[2:6])
  assert not np.array_equal(perm(0)[:2], perm(1)[:2])     # the two epochs differ there
