"""purax.app.search: a grid is the cartesian product of the values with the
seeds; log-uniform draws are float32 within their bounds."""

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from purax.app import search


@settings(max_examples=10)
@given(lists=st.lists(st.lists(st.floats(1e-5, 1.0), min_size=1, max_size=3),
                      min_size=1, max_size=3),
       seeds=st.lists(st.integers(0, 99), min_size=1, max_size=3))
def test_grid_is_the_cartesian_product_with_seeds(lists, seeds):
  values = {f'h{i}': v for i, v in enumerate(lists)}
  got_seeds, hparams = search.grid(values, seeds)
  size = len(seeds) * int(np.prod([len(v) for v in lists]))
  assert got_seeds.shape == (size,) and got_seeds.dtype == np.int32
  points = {tuple(float(hparams[n][m]) for n in values) + (int(got_seeds[m]),)
            for m in range(size)}
  distinct = len(set(seeds)) * int(np.prod([len(set(np.float32(v))) for v in lists]))
  assert len(points) == distinct   # every combination appears
  for n, v in values.items():
    assert hparams[n].dtype == np.float32 and set(hparams[n]) == set(np.float32(v))


@settings(max_examples=10)
@given(low=st.floats(1e-6, 1e-2), ratio=st.floats(1.0, 1e4), members=st.sampled_from([1, 16]))
def test_log_uniform_draws_float32_within_bounds(low, ratio, members):
  high = low * ratio
  v = np.asarray(search.log_uniform(jax.random.key(0), low, high, members))
  assert v.shape == (members,) and v.dtype == np.float32
  assert np.all(v >= np.float32(low) * (1 - 1e-6)) and np.all(v <= np.float32(high) * (1 + 1e-6))
