"""The objective handed to line searches (optax's ``value_fn``,
purax.core.update.objective) is the loss the step computed: with dropout and
microbatches, value_fn(params) at the step's params equals the step's loss,
so each microbatch has the step's own dropout key (fold_in(key, i))."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import purax


def capture():
  """A transformation (extra args) that applies no update and keeps
  ``value`` and ``value_fn(params)`` in its state."""

  def init(params):
    del params
    return {'value': jnp.zeros(()), 'value_fn': jnp.zeros(())}

  def update(updates, state, params=None, *, value, value_fn, **extra):
    del state, extra
    return (jax.tree.map(jnp.zeros_like, updates),
            {'value': jnp.asarray(value, jnp.float32),
             'value_fn': jnp.asarray(value_fn(params), jnp.float32)})
  return optax.GradientTransformationExtraArgs(init, update)


@pytest.mark.parametrize('microbatches', [1, 4])
def test_value_fn_is_the_loss_the_step_computed_with_dropout(microbatches):
  task = purax.Task(model=purax.nn.MLP(num_classes=3, features=(32,), dropout_rate=0.5),
                    tx=capture(), microbatches=microbatches)
  rng = np.random.default_rng(0)
  batch = {'x': rng.normal(size=(16, 6)).astype(np.float32),
           'y': rng.integers(0, 3, 16).astype(np.int32)}
  state = task.init(jax.random.key(0), batch)
  stepped, metrics = jax.jit(task.step)(state, batch)
  loss = purax.metrics.compute(metrics)['loss']
  value, value_fn = (float(stepped.opt_state[k]) for k in ('value', 'value_fn'))
  np.testing.assert_allclose(value, loss, rtol=1e-6)
  np.testing.assert_allclose(value_fn, value, rtol=1e-5)
  # Dropout matters here: another key gives another loss.
  other = task.compute_loss(state.params, state.model_state, batch, jax.random.key(99))[0]
  assert abs(float(other) - value) > 1e-3
