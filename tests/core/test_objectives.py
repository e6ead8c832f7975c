"""Losses as functions: the contract, user hyperparameters in the state,
populations over them, and losses that couple examples."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st

import purax
from purax import parallel, testing
from purax.core import population
from purax.core.losses import top1_correct


class Embed(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(8)(jax.nn.relu(nn.Dense(16)(x)))


@purax.loss_function(hparams={'temperature': 0.5}, couples_examples=True)
def supcon(z, batch, hparams):
  """Supervised contrastive loss (Khosla et al. 2020): every other example of the
  same class is a positive, all others negatives. values [batch]."""
  z = z / jnp.linalg.norm(z, axis=-1, keepdims=True)
  n = z.shape[0]
  self_mask = jnp.eye(n, dtype=bool)
  sim = jnp.where(self_mask, -1e9, z @ z.T / hparams['temperature'])
  positive = (batch['y'][:, None] == batch['y'][None, :]) & ~self_mask
  log_prob = sim - jax.nn.logsumexp(sim, axis=1, keepdims=True)
  count = positive.sum(axis=1)
  values = -jnp.where(positive, log_prob, 0.0).sum(axis=1) / jnp.maximum(count, 1).astype(z.dtype)
  return values, (count > 0).astype(jnp.float32), {'positives': count.astype(jnp.float32)}


def batch(seed=0, n=16):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 4, n).astype(np.int32)
  x = (rng.normal(size=(n, 6)) + y[:, None]).astype(np.float32)
  return {'x': x, 'y': y}


def task(**kw):
  return purax.Task(model=Embed(), tx=purax.adamw(learning_rate=1e-2, total_steps=100),
                    loss=supcon, **kw)


def test_a_custom_loss_with_its_own_hyperparameter_trains():
  t = task(hparams={'temperature': 0.2})
  state = t.init(jax.random.key(0), batch())
  assert state.hparams['temperature'].dtype == jnp.float32
  assert float(state.hparams['temperature']) == pytest.approx(0.2)
  assert float(purax.hyperparams(state, t.tx)['temperature']) == pytest.approx(0.2)
  step = jax.jit(t.step)
  first = None
  for s in range(40):
    state, m = step(state, batch(s % 4))
    m = purax.metrics.compute(m)
    first = m['loss'] if first is None else first
  assert m['loss'] < first * 0.8
  assert m['positives'] > 0 and m['examples'] == 16


def test_a_population_over_the_loss_hyperparameter_equals_standalone_runs():
  temps, lrs = [0.1, 0.5, 1.0], [1e-2, 3e-3, 1e-2]
  keys = jax.vmap(jax.random.key)(jnp.arange(3))
  t = task()
  hp = {'temperature': jnp.array(temps), 'learning_rate': jnp.array(lrs)}
  with jax.default_matmul_precision('highest'):
    pop = population.init(t, keys, hp, batch())
    pstep = jax.jit(lambda p, b: population.step(t, p, b))
    for s in range(3):
      pop, _ = pstep(pop, batch(s))
    for i in range(3):
      single_task = task(hparams={'temperature': temps[i]})
      state = single_task.init(jax.random.key(i), batch())
      state = purax.set_hyperparams(state, learning_rate=lrs[i])
      step = jax.jit(single_task.step)
      for s in range(3):
        state, _ = step(state, batch(s))
      testing.assert_trees_close(population.member(pop, i), state,
                                 testing.Tolerance(rtol=1e-5, atol=1e-6), what=f'member {i}')


def test_a_loss_that_couples_examples_is_refused_where_it_would_change():
  with pytest.raises(purax.ConfigError, match='microbatches: expected 1 for a loss that couples'):
    task(microbatches=2)
  t = task()
  b = batch()
  state = jax.jit(t.init)(jax.random.key(0), b)
  mesh = testing.mesh_of({'data': 2})
  with pytest.raises(purax.ConfigError, match='axis_name: expected None for a loss that couples'):
    parallel.shard_map_step(t, mesh)(state, b)
  with pytest.raises(purax.ConfigError, match='axis_name: expected None for a loss that couples'):
    parallel.pmap_step(t, devices=jax.local_devices()[:2])(
        parallel.replicate(state, 2), parallel.split_batch(b, 2))


def test_a_loss_that_couples_examples_is_exact_under_jit_with_shardings():
  with jax.default_matmul_precision('highest'):
    testing.assert_step_matches_single_device(task(), testing.mesh_of({'data': 4}),
                                              parallel.data_parallel(), [batch(0), batch(1)])


def _contract_task(loss):
  return purax.Task(model=Embed(), tx=optax.sgd(0.1), loss=loss)


@pytest.mark.parametrize('loss, match', [
    (lambda z, b, h: jnp.sum(z, axis=1), r'expected a tuple \(values \[batch, \.\.\.\], weight or None, metrics dict\), got ArrayImpl|got DynamicJaxprTracer'),
    (lambda z, b, h: (jnp.sum(z, axis=1), None), r'got tuple of length 2'),
    (lambda z, b, h: (jnp.sum(z), None, {}), r'values: expected a float array \[batch\] or \[batch, \.\.\.\], got float32\[\]'),
    (lambda z, b, h: (jnp.sum(z, axis=1), jnp.ones(3), {}), r'weight: expected None or a float array of shape \[16\]'),
    (lambda z, b, h: (jnp.sum(z, axis=1), None, {'m': jnp.ones(5)}), r"metrics\['m'\]: expected shape \[16\] or \[\]"),
    (lambda z, b, h: (jnp.sum(z, axis=1), None, {'m': 'high'}), r"metrics\['m'\]: expected an array or a purax.metrics object"),
    (lambda z, b, h: (jnp.sum(z, axis=1), None, [1.0]), r'metrics: expected a dict'),
])
def test_a_loss_outside_the_contract_is_named(loss, match):
  with pytest.raises(purax.ContractError, match=match):
    _contract_task(loss).init(jax.random.key(0), batch())


def test_plain_array_metrics_are_averaged_by_weight_and_metric_objects_kept():
  def loss(z, b, h):
    values = jnp.sum(z ** 2, axis=1)
    weight = jnp.where(jnp.arange(16) < 8, 1.0, 0.0)
    return values, weight, {'per_example': jnp.arange(16.0), 'batch_level': jnp.float32(3.0),
                            'count': purax.metrics.Sum.of(weight)}
  t = _contract_task(loss)
  state = t.init(jax.random.key(0), batch())
  m = purax.metrics.compute(t.evaluate(state, batch()))
  assert m['per_example'] == pytest.approx(np.mean(np.arange(8.0)))   # padding excluded
  assert m['batch_level'] == pytest.approx(3.0)
  assert m['count'] == 8 and m['examples'] == 8
  z = t.predict(state, batch()['x'])
  assert m['loss'] == pytest.approx(float(jnp.mean(jnp.sum(z[:8] ** 2, axis=1))), rel=1e-5)


def test_a_per_example_metric_of_a_per_token_loss_counts_rows_with_weight():
  """values [batch, seq] with a [batch] metric: averaged over rows that carry weight."""
  def loss(z, b, h):
    values = jnp.broadcast_to(jnp.sum(z ** 2, axis=1)[:, None], (16, 3))
    weight = jnp.where(jnp.arange(16)[:, None] < 4, 1.0, 0.0) * jnp.ones((1, 3))
    return values, weight, {'row_id': jnp.arange(16.0)}
  t = _contract_task(loss)
  m = purax.metrics.compute(t.evaluate(t.init(jax.random.key(0), batch()), batch()))
  assert m['row_id'] == pytest.approx(1.5)          # rows 0..3 only
  assert m['examples'] == 4


@settings(max_examples=30)
@given(classes=st.sampled_from([1, 3, 10]), data=st.data())
def test_accuracy_is_argmax_with_its_first_index_tie_break(classes, data):
  """losses.top1_correct (classification's accuracy, no argmax pass) counts what
  ``argmax(logits) == y`` counts, ties included: integer logits tie often, and
  all-equal logits (a zero-initialized head) are correct for class 0 only."""
  logits = np.asarray(data.draw(st.lists(st.integers(-2, 2), min_size=6 * classes,
                                         max_size=6 * classes)), np.float32).reshape(6, classes)
  y = np.asarray(data.draw(st.lists(st.integers(0, classes - 1), min_size=6, max_size=6)))
  want = (np.argmax(logits, axis=-1) == y).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(_top1(logits, y)), want)
  zeros = np.asarray(_top1(np.zeros((classes, classes), np.float32), np.arange(classes)))
  np.testing.assert_array_equal(zeros, np.eye(1, classes)[0])


_top1 = jax.jit(top1_correct)
