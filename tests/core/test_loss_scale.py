"""Dynamic loss scaling (purax.core.loss_scale.LossScale): the scale halves on
overflow, grows after a finite run and stays a finite power of two; it doubles
exactly at the ``growth_interval``-th finite step. The scaled update equals the
unscaled one bitwise: tests/core/test_update.py."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from purax.core.loss_scale import LossScale


@settings(max_examples=30)
@given(st.lists(st.booleans(), min_size=1, max_size=60), st.sampled_from([1.0, 2.0 ** 15, 2.0 ** 24]))
def test_the_loss_scale_halves_on_overflow_grows_after_a_finite_run_and_stays_finite(finites, init):
  state = LossScale.create(init, growth_interval=3, max_scale=2.0 ** 24)
  update = jax.jit(lambda s, f: s.update(f))
  for finite in finites:
    before = float(state.scale)
    state = update(state, jnp.asarray(finite))
    after = float(state.scale)
    assert np.isfinite(after) and 1.0 <= after <= 2.0 ** 24
    assert after == (before if before == 1.0 else before / 2) if not finite else after >= before
    assert np.log2(after) == int(np.log2(after))       # stays a power of two


def test_the_loss_scale_doubles_exactly_after_growth_interval_finite_steps():
  """Issue 27.7: with growth_interval=3 the scale doubles at the 3rd finite step of a
  run (not the 2nd or 4th) and halves at once on a non-finite one."""
  state = LossScale.create(8.0, growth_interval=3, max_scale=2.0 ** 24)
  scales = []
  for finite in [True, True, True, True, True, True, False, True, True, True]:
    state = state.update(jnp.asarray(finite))
    scales.append(float(state.scale))
  assert scales == [8, 8, 16, 16, 16, 32, 16, 16, 16, 32]
