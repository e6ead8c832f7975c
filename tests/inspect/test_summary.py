"""purax.inspect.summary: counts and bytes read from shapes (abstract or real)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import purax
from purax.inspect import summary


def cnn_task_and_batch():
  task = purax.Task(model=purax.nn.CNN(num_classes=10),
                    tx=purax.adamw(learning_rate=1e-3, total_steps=10))
  return task, {'x': np.zeros((8, 8, 8, 1), np.float32), 'y': np.zeros((8,), np.int32)}


def test_abstract_and_real_state_give_the_same_summary_and_the_real_bytes():
  task, batch = cnn_task_and_batch()
  abstract = jax.eval_shape(task.init, jax.random.key(0), batch)
  real = jax.jit(task.init)(jax.random.key(0), batch)
  s = summary.summarize(abstract)
  assert s == summary.summarize(real)
  assert [m[0] for m in s.modules] == ['Conv_0', 'Conv_1', 'Dense_0', 'Dense_1']
  assert s.total_params == sum(x.size for x in jax.tree.leaves(real.params))
  assert s.modules[0][1] == 3 * 3 * 1 * 32 + 32          # the first conv: 3x3 kernel, 32 maps
  assert s.bytes_per_device['params'] == sum(x.nbytes for x in jax.tree.leaves(real.params))
  key_bytes = jax.random.key_data(real.rng).nbytes
  leaves = [x for x in jax.tree.leaves(real) if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)]
  assert s.bytes_per_device['total'] == sum(x.nbytes for x in leaves) + key_bytes
  text = summary.format_summary(s)
  assert 'Conv_1' in text and f'{s.total_params:,}' in text and 'state per device' in text


def test_any_params_tree_and_sharded_leaves():
  params = {'a': {'w': jnp.zeros((4, 8)), 'b': jnp.zeros((8,), jnp.bfloat16)},
            'c': jnp.zeros((3,), jnp.int8)}
  s = summary.summarize(params)
  assert s.modules == (('a', 40, 4 * 32 + 2 * 8), ('c', 3, 3))
  mesh = jax.make_mesh((4,), ('data',), devices=jax.devices()[:4])
  split = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=NamedSharding(mesh, P('data')))
  whole = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=NamedSharding(mesh, P()))
  assert summary.tree_bytes_per_device([split, whole]) == 8 * 16 * 4 // 4 + 8 * 16 * 4
  assert summary.summarize(split).total_params == 128


def test_compiled_cost_reads_flops_and_memory():
  f = jax.jit(lambda a, b: a @ b)
  a = jax.ShapeDtypeStruct((64, 32), jnp.float32)
  b = jax.ShapeDtypeStruct((32, 16), jnp.float32)
  cost = summary.compiled_cost(f.lower(a, b).compile())
  assert cost['flops'] == 2 * 64 * 32 * 16
  assert cost['argument_bytes'] == (64 * 32 + 32 * 16) * 4
  assert cost['output_bytes'] == 64 * 16 * 4
  assert 'GFLOP' in summary.format_cost(cost) and cost['loops'] == 0


def test_a_loop_is_flagged_since_xla_counts_its_body_once():
  def f(a):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ c), None), a, None, length=6)[0]
  a = jax.ShapeDtypeStruct((32, 32), jnp.float32)
  cost = summary.compiled_cost(jax.jit(f).lower(a).compile())
  assert cost['loops'] == 1
  assert 'loop body once' in summary.format_cost(cost)


def test_human_bytes():
  assert summary.human_bytes(512) == '512 B'
  assert summary.human_bytes(1536) == '1.50 KiB'
  assert summary.human_bytes(3 * 2 ** 30) == '3.00 GiB'


@pytest.mark.parametrize('min_size', [1024, 1])
def test_summary_shows_each_parameters_partition_spec_and_bytes_per_device(min_size):
  """Issue 29.6 on 8 host devices: purax.summary(task, batch, plan) gives, per
  parameter, the PartitionSpec and bytes per device the plan really places
  (checked against the placed state's shards); fsdp()'s min_size leaves the
  small arrays replicated, and the summary shows it."""
  task = purax.Task(model=purax.nn.MLP(num_classes=10, features=(64,)),
                    tx=purax.adamw(learning_rate=1e-3, total_steps=10))
  batch = {'x': np.zeros((8, 40), np.float32), 'y': np.zeros((8,), np.int32)}
  mesh = purax.parallel.make_mesh(data=2, fsdp=4)
  plan = purax.parallel.sharded(task, mesh, purax.parallel.fsdp(min_size), batch)
  rows = {p.path: p for p in purax.summary(task, batch, plan).params}
  assert {k: (r.shape, r.dtype, r.spec, r.bytes_per_device) for k, r in rows.items()} == {
      'Dense_0/kernel': ((40, 64), 'float32', P(None, 'fsdp'), 40 * 64 * 4 // 4),   # 2560 >= 1024
      'Dense_0/bias': ((64,), 'float32', P() if min_size > 1 else P('fsdp'),
                       64 * 4 // (1 if min_size > 1 else 4)),
      'Dense_1/kernel': ((64, 10), 'float32', P() if min_size > 1 else P('fsdp', None),
                         64 * 10 * 4 // (1 if min_size > 1 else 4)),       # 640 < 1024
      'Dense_1/bias': ((10,), 'float32', P(), 10 * 4)}                     # 4 does not divide 10
  placed = plan.init_state(jax.random.key(0), batch).params
  for path, leaf in jax.tree_util.tree_leaves_with_path(placed):
    row = rows[jax.tree_util.keystr(path, simple=True, separator='/')]
    assert leaf.sharding.spec == row.spec
    assert max(s.data.nbytes for s in leaf.addressable_shards) == row.bytes_per_device
  alone = {p.path: p for p in purax.summary(task, batch).params}     # one device: no spec
  assert alone['Dense_0/kernel'].spec is None
  assert alone['Dense_0/kernel'].bytes_per_device == 40 * 64 * 4
  text = str(purax.summary(task, batch, plan))
  assert 'PartitionSpec' in text and "Dense_0/kernel  [40, 64]  float32  P(" in text
