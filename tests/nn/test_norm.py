"""Padding changes nothing, on every execution path (issue 14, item 1): the
batch statistics of purax.nn.norm.BatchNorm count only real rows.

A ResNet (BatchNorm) step on 8 real rows plus 8 zero rows of weight 0 equals
the step on the 8 real rows alone — params, batch statistics and every metric
— under ``jax.jit``, the sharded plan (jit + NamedSharding), ``shard_map``
and ``pmap``. On the per-device paths the real rows are spread unevenly
(4, 3, 1 and 0 per device): the statistics must still be the global batch's,
which averaging per-device means would not give.

Tolerance 1e-5 (the issue's bound) at ``highest`` matmul precision: the two
runs differ only in float summation order. The optimizer is SGD: Adam's first
updates are ``lr * sign(g)`` for tiny gradients, which turns summation-order
noise into differences of ``2 * lr``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import purax
from purax import parallel

TOL = 1e-5
DEVICES = 4
TASK = purax.Task(model=purax.nn.ResNet(num_classes=4, stage_features=(4, 8)),
                  tx=optax.sgd(0.1))
# Row i of the padded batch holds real row REAL_AT.index(i), or padding. Split
# over 4 devices (rows 4d .. 4d+3) the devices hold 4, 3, 1 and 0 real rows.
REAL_AT = [0, 1, 2, 3, 4, 5, 6, 8]


def _batches(step):
  rng = np.random.default_rng(step)
  x = rng.normal(size=(8, 4, 4, 1)).astype(np.float32) + 0.5
  y = rng.integers(0, 4, 8).astype(np.int32)
  real = {'x': x, 'y': y, 'weight': np.ones(8, np.float32)}
  padded = {'x': np.zeros((16, 4, 4, 1), np.float32), 'y': np.zeros(16, np.int32),
            'weight': np.zeros(16, np.float32)}
  for k, v in real.items():
    padded[k][REAL_AT] = v
  return real, padded


BATCHES = [_batches(s) for s in range(2)]


def _max_diff(a, b):
  diffs = jax.tree.map(lambda u, v: float(jnp.max(jnp.abs(jnp.asarray(u, jnp.float32)
                                                          - jnp.asarray(v, jnp.float32)))),
                       a, b)
  return max(jax.tree.leaves(diffs))


def _reference():
  """Two steps on the real rows alone, single device."""
  with jax.default_matmul_precision('highest'):
    state = jax.jit(TASK.init)(jax.random.key(0), BATCHES[0][0])
    step = jax.jit(TASK.step)
    out = []
    for real, _ in BATCHES:
      state, metrics = step(state, real)
      out.append((jax.device_get(state), purax.metrics.compute(metrics)))
  return out


REFERENCE = _reference()


def _check(step, state, prepare=lambda b: b, finish=lambda t: t):
  with jax.default_matmul_precision('highest'):
    for (_, padded), (ref_state, ref_metrics) in zip(BATCHES, REFERENCE):
      state, metrics = step(state, prepare(padded))
      got, got_metrics = finish((state, metrics))
      assert _max_diff(got.params, ref_state.params) < TOL
      assert _max_diff(got.model_state, ref_state.model_state) < TOL
      got_metrics = purax.metrics.compute(got_metrics)
      assert ref_metrics.keys() <= got_metrics.keys()   # a population adds 'diverged'
      for k in ref_metrics:
        assert got_metrics[k] == pytest.approx(ref_metrics[k], abs=TOL), k
      assert got_metrics['examples'] == 8


def _init():
  return jax.jit(TASK.init)(jax.random.key(0), BATCHES[0][0])


def test_padding_changes_nothing_under_jit():
  _check(jax.jit(TASK.step), _init())


def test_padding_changes_nothing_on_the_sharded_plan(data=4):
  mesh = parallel.make_mesh(data=data, devices=jax.devices()[:data])
  plan = parallel.sharded(TASK, mesh, parallel.data_parallel(), BATCHES[0][1])
  _check(plan.step, plan.init(jax.random.key(0)), prepare=plan.shard_batch)


def test_padding_changes_nothing_under_shard_map_with_uneven_real_rows():
  mesh = parallel.make_mesh(data=DEVICES, devices=jax.devices()[:DEVICES])
  _check(parallel.shard_map_step(TASK, mesh), _init())


def test_padding_changes_nothing_under_pmap_with_uneven_real_rows():
  step = parallel.pmap_step(TASK, devices=jax.devices()[:DEVICES])
  _check(step, parallel.replicate(_init(), DEVICES),
         prepare=lambda b: parallel.split_batch(b, DEVICES),
         finish=parallel.unreplicate)


def test_evaluate_ignores_padding():
  state = jax.tree.map(lambda x: x, REFERENCE[0][0])
  real, padded = BATCHES[1]
  got = purax.metrics.compute(jax.jit(TASK.evaluate)(state, padded))
  want = purax.metrics.compute(jax.jit(TASK.evaluate)(state, real))
  assert got == pytest.approx(want, abs=TOL)


def test_an_all_padding_batch_leaves_the_running_statistics_unchanged():
  state = _init()
  _, padded = BATCHES[0]
  empty = dict(padded, weight=np.zeros(16, np.float32))
  _, aux = jax.jit(TASK.compute_loss)(state.params, state.model_state, empty, None)
  assert _max_diff(aux['model_state'], state.model_state) == 0.0
  assert bool(jnp.all(jnp.isfinite(aux['outputs'])))


def test_batchnorm_moments_over_devices_are_the_global_ones():
  """Sums and counts, not per-device means: 4, 3, 1 and 0 real rows per device."""
  from purax.nn.norm import masked_moments
  rng = np.random.default_rng(0)
  x = rng.normal(size=(16, 3, 5)).astype(np.float32) * 3 + 7
  mask = np.isin(np.arange(16), REAL_AT)
  mesh = parallel.make_mesh(data=DEVICES, devices=jax.devices()[:DEVICES])
  P = jax.sharding.PartitionSpec
  per_device = jax.jit(jax.shard_map(lambda a, m: masked_moments(a, m, 'data'), mesh=mesh,
                                     in_specs=(P('data'), P('data')), out_specs=P(),
                                     check_vma=False))
  mean, var, count = per_device(x, mask)
  real = x[mask].astype(np.float64)
  np.testing.assert_allclose(mean, real.mean((0, 1)), rtol=1e-6)
  np.testing.assert_allclose(var, real.var((0, 1)), rtol=1e-5)
  assert float(count) == 8 * 3


def test_padding_changes_nothing_for_a_population():
  """vmap over members: each member's padded step equals the reference."""
  from purax.core import population
  pop = population.init(TASK, jax.vmap(jax.random.key)(jnp.zeros((2,), jnp.uint32)), {},
                        BATCHES[0][0])
  step = jax.jit(lambda p, b: population.step(TASK, p, b))
  _check(step, pop, finish=lambda t: (population.member(t[0], 1),
                                      jax.tree.map(lambda x: x[1], t[1])))
