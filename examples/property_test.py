"""A hypothesis property: my own training step (a flax TrainState, optax, the
contrastive loss of own_model_contrastive.py; no purax Task) jitted on a mesh of
CPU devices equals the same step on one device, checked with `purax.testing`.
Run it (`python examples/property_test.py`) or collect it with pytest.
`PURAX_EXAMPLE_TINY=1`: fewer examples."""
import os
os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')   # before jax
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state
from hypothesis import given, settings, strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P
from purax import testing
from own_model_contrastive import Embed, supcon

EXAMPLES, LR = (2 if os.environ.get('PURAX_EXAMPLE_TINY') else 8), 1e-3

def loss_fn(params, state, batch):
  values, weight, _ = supcon(state.apply_fn({'params': params}, batch['x']), batch,
                             {'temperature': 0.1})
  return jnp.sum(values * weight) / jnp.sum(weight)

def my_step(state, batch):
  loss, grads = jax.value_and_grad(loss_fn)(state.params, state, batch)
  return state.apply_gradients(grads=grads), {'loss': loss}

def my_grads(state, batch):
  return jax.grad(loss_fn)(state.params, state, batch)

def on_mesh(fn, mesh):
  """``fn(state, batch)`` jitted, the state replicated and the batch split over every mesh axis."""
  replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P(mesh.axis_names))
  return lambda state, batch: jax.jit(fn)(jax.device_put(state, replicated),
                                          jax.device_put(batch, rows))

@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None)
@given(shape=testing.mesh_shapes(), steps=st.integers(1, 3), data=st.data())
def test_my_step_on_a_mesh_equals_the_single_device_step(shape, steps, data):
  mesh = testing.mesh_of(shape)
  batch_size = data.draw(st.sampled_from([b for b in (16, 32) if b % mesh.size == 0]))
  batches = data.draw(testing.classification_batches(batch_size, (8, 8, 1), 10, steps=steps))
  model = Embed()
  params = model.init(jax.random.key(0), batches[0]['x'])['params']
  state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(LR))
  with jax.default_matmul_precision('highest'):
    for batch in batches:   # the property is per step: both steps start from the same state
      testing.assert_trees_close(on_mesh(my_grads, mesh)(state, batch), jax.jit(my_grads)(
          state, batch), testing.TOLERANCES['grads'], what='grads')
      # Adam turns rounding noise in a near-zero gradient into up to +-lr: learning_rate=LR
      # widens the params tolerance by 2 * lr (purax.testing); loss and grads stay tight.
      testing.assert_same_training(jax.jit(my_step), state, on_mesh(my_step, mesh), state,
                                   [batch], learning_rate=LR)
      state = jax.jit(my_step)(state, batch)[0]

if __name__ == '__main__':
  test_my_step_on_a_mesh_equals_the_single_device_step()
  print(f'property_test: my step on meshes of up to {jax.device_count()} CPU devices equals the '
        f'single-device step ({EXAMPLES} hypothesis examples)')
