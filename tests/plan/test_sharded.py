"""The jitted step on a mesh equals the single-device step on the global batch.

Hypothesis draws the mesh shape and the batch size; every comparison (loss,
gradients, params after k steps, BatchNorm statistics) goes through
purax.testing at highest matmul precision with its stated tolerances.
"""

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import purax
from purax import parallel, testing

MLP = purax.Task(model=purax.nn.MLP(num_classes=4, features=(16, 16)),
                 tx=purax.adamw(learning_rate=1e-2, total_steps=10))
RESNET = purax.Task(model=purax.nn.ResNet(num_classes=4, stage_features=(4,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=10))
DROPOUT = purax.Task(model=purax.nn.MLP(num_classes=4, features=(16,), dropout_rate=0.5),
                     tx=purax.adamw(learning_rate=1e-2, total_steps=10))
STEPS = 2

# Mesh shapes are drawn from a small set so that compiled steps are reused.
DP_MESHES = st.sampled_from([{'data': 8, 'fsdp': 1, 'tensor': 1},
                             {'data': 2, 'fsdp': 2, 'tensor': 1},
                             {'data': 4, 'fsdp': 1, 'tensor': 1}])
FSDP_MESHES = st.sampled_from([{'data': 1, 'fsdp': 8, 'tensor': 1},
                               {'data': 2, 'fsdp': 4, 'tensor': 1},
                               {'data': 1, 'fsdp': 2, 'tensor': 1}])
TP_MESHES = st.sampled_from([{'data': 4, 'fsdp': 1, 'tensor': 2},
                             {'data': 1, 'fsdp': 2, 'tensor': 4},
                             {'data': 2, 'fsdp': 1, 'tensor': 2}])


def _check(task, sizes, rules, data, input_shape=(8,), weighted=False):
  mesh = testing.mesh_of(sizes)
  batch_size = data.draw(testing.batch_sizes(mesh, rules, candidates=(8, 16)), 'batch_size')
  batches = data.draw(testing.classification_batches(batch_size, input_shape, 4,
                                                     steps=STEPS, weighted=weighted))
  with jax.default_matmul_precision('highest'):
    testing.assert_step_matches_single_device(task, mesh, rules, batches)


@settings(max_examples=2)
@given(sizes=DP_MESHES, weighted=st.booleans(), data=st.data())
def test_data_parallel_equals_single_device(sizes, weighted, data):
  _check(MLP, sizes, parallel.data_parallel(), data, weighted=weighted)


@settings(max_examples=2)
@given(sizes=FSDP_MESHES, data=st.data())
def test_fsdp_equals_single_device(sizes, data):
  _check(MLP, sizes, parallel.fsdp(min_size=64), data)


@settings(max_examples=2)
@given(sizes=TP_MESHES, data=st.data())
def test_tensor_parallel_equals_single_device(sizes, data):
  _check(MLP, sizes, parallel.tensor_parallel(fsdp_min_size=64), data)


@settings(max_examples=2)
@given(sizes=st.sampled_from([{'data': 4, 'fsdp': 2, 'tensor': 1},
                              {'data': 1, 'fsdp': 8, 'tensor': 1}]), data=st.data())
def test_batchnorm_statistics_equal_single_device(sizes, data):
  """jit + sharding normalizes over the global batch: stats and params match."""
  _check(RESNET, sizes, parallel.fsdp(min_size=64), data, input_shape=(4, 1))


def test_dropout_under_jit_and_sharding_equals_single_device():
  """With partitionable threefry, the sharded dropout mask is the global one."""
  assert jax.config.jax_threefry_partitionable
  rng = np.random.default_rng(0)
  batches = [{'x': rng.normal(size=(16, 8)).astype(np.float32),
              'y': rng.integers(0, 4, 16).astype(np.int32)} for _ in range(STEPS)]
  with jax.default_matmul_precision('highest'):
    testing.assert_step_matches_single_device(
        DROPOUT, parallel.make_mesh(data=4, fsdp=2), parallel.fsdp(min_size=64), batches)


MUON = purax.Task(model=purax.nn.MLP(num_classes=4, features=(16, 16)),
                  tx=purax.core.optimizers.muon(learning_rate=2e-2, total_steps=10))


def test_muon_on_an_fsdp_mesh_equals_muon_on_one_device():
  """Muon (the hidden kernels orthogonalised by 5 Newton-Schulz iterations,
  the head and vectors AdamW) with every kernel split over fsdp=8: the
  state after 3 steps equals one device's within testing.TOLERANCES (params
  rtol 1e-4, atol 1e-5; lr 2e-2 widens it by 2 * lr per step for gradient
  entries that are rounding noise, as for Adam). Not bitwise: the
  Newton-Schulz products of a sharded matrix are partial sums all-reduced
  over the mesh, in another order than one device's."""
  rng = np.random.default_rng(0)
  batches = [{'x': rng.normal(size=(16, 8)).astype(np.float32),
              'y': rng.integers(0, 4, 16).astype(np.int32)} for _ in range(3)]
  mesh = parallel.make_mesh(fsdp=8)
  plan = parallel.sharded(MUON, mesh, parallel.fsdp(min_size=64), batches[0])
  assert plan.state_sharding.params['Dense_1']['kernel'].spec != jax.sharding.PartitionSpec()
  with jax.default_matmul_precision('highest'):
    testing.assert_step_matches_single_device(MUON, mesh, parallel.fsdp(min_size=64), batches,
                                              learning_rate='auto')


@pytest.mark.parametrize('sizes, rules', [
    ({'data': 4, 'fsdp': 2, 'tensor': 1}, parallel.data_parallel()),
    ({'data': 1, 'fsdp': 8, 'tensor': 1}, parallel.fsdp(min_size=16)),
    ({'data': 2, 'fsdp': 1, 'tensor': 4}, parallel.tensor_parallel(fsdp_min_size=None)),
])
def test_the_state_born_sharded_is_the_single_device_init(sizes, rules):
  """``plan.init`` creates the state in its sharding (no device holds a whole
  FSDP parameter); its values are ``task.init``'s on one device, bitwise
  (purax.testing starts the sharded run from the single-device state, so
  this is checked here)."""
  mesh = testing.mesh_of(sizes)
  rng = np.random.default_rng(0)
  batch = {'x': rng.normal(size=(16, 8)).astype(np.float32),
           'y': rng.integers(0, 4, 16).astype(np.int32)}
  plan = parallel.sharded(MLP, mesh, rules, batch)
  born = plan.init(jax.random.key(3))
  single = jax.jit(MLP.init)(jax.random.key(3), batch)
  assert jax.tree.structure(born) == jax.tree.structure(single)
  for a, b, s in zip(jax.tree.leaves(born), jax.tree.leaves(single),
                     jax.tree.leaves(plan.state_sharding)):
    assert a.sharding.is_equivalent_to(s, a.ndim)
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sharded_step_keeps_shardings_and_donates():
  mesh = parallel.make_mesh(data=2, fsdp=4)
  batch = {'x': np.ones((8, 8), np.float32), 'y': np.zeros((8,), np.int32)}
  plan = parallel.sharded(MLP, mesh, parallel.fsdp(min_size=64), batch)
  state = plan.init(jax.random.key(0))
  old = state
  for _ in range(3):
    state, _ = plan.step(state, plan.shard_batch(batch))
  assert old.params['Dense_0']['kernel'].is_deleted()      # donated
  assert jax.tree.map(lambda x: x.sharding, state) == plan.state_sharding
  acc = purax.metrics.zeros_like(jax.eval_shape(lambda s, b: MLP.step(s, b)[1], state, batch))
  state, acc = plan.train_step(state, acc, plan.shard_batch(batch))
  assert purax.metrics.compute(acc)['examples'] == 8
  ev = purax.metrics.compute(plan.eval_step(state, plan.shard_batch(batch)))
  assert ev['examples'] == 8


def test_sharded_rejects_bad_batch_before_compiling():
  with pytest.raises(purax.DataError, match=r"batch\['y'\].dtype"):
    parallel.sharded(MLP, parallel.make_mesh(), parallel.data_parallel(),
                     {'x': np.ones((8, 8), np.float32), 'y': np.zeros((8,), np.float32)})


def test_sharded_plan_evaluates_padded_eval_batches_as_one_device():
  """One batch sharding for any batch pytree: purax's padded eval batches (with
  'weight') run on the plan; 997 examples on data=4 count 997 exactly."""
  from purax import loop
  from purax.io import pipeline
  rng = np.random.default_rng(0)
  x = rng.normal(size=(997, 8)).astype(np.float32)
  y = rng.integers(0, 4, 997).astype(np.int32)
  batches = pipeline.eval_batches(x, y, batch_size=100)     # the last: 97 real, 3 padding
  mesh = parallel.make_mesh(data=4, devices=jax.devices()[:4])
  plan = parallel.sharded(MLP, mesh, parallel.data_parallel(), {'x': x[:8], 'y': y[:8]})
  state = plan.init(jax.random.key(0))
  with jax.default_matmul_precision('highest'):
    got = loop.evaluate(MLP, state, batches, plan=plan)
    one = plan.eval_step(state, plan.shard_batch(batches[9]))   # the jitted function itself
    want = loop.evaluate(MLP, jax.device_get(state), batches)
  assert got['examples'] == 997
  assert purax.metrics.compute(one)['examples'] == 97
  for k in want:
    assert got[k] == pytest.approx(want[k], rel=1e-6), k
