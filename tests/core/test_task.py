"""The pure functions of purax.core.task: gradients, purity (jit/eager/pmap parity:
test_task_variants.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import purax
from purax import nn as pnn
from purax.core import metrics
from tests.helpers import params_differ, tiny_batch, tiny_task, tree_equal


def test_init_state_fields_are_arrays():
  task = tiny_task('resnet')
  state = jax.jit(task.init)(jax.random.key(0), tiny_batch())
  assert state.step.dtype == jnp.int32 and state.step.shape == ()
  assert jnp.issubdtype(state.rng.dtype, jax.dtypes.prng_key)
  assert 'batch_stats' in state.model_state
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state))
  # eval_shape and vmap work on init.
  abstract = jax.eval_shape(task.init, jax.random.key(0), tiny_batch())
  assert jax.tree.structure(abstract) == jax.tree.structure(state)
  stacked = jax.jit(jax.vmap(task.init, in_axes=(0, None)))(
      jax.random.split(jax.random.key(0), 3), tiny_batch())
  assert stacked.step.shape == (3,)


def test_raw_uint32_key_is_accepted():
  task = tiny_task()
  a = task.init(jax.random.PRNGKey(1), tiny_batch())
  b = task.init(jax.random.wrap_key_data(jax.random.PRNGKey(1)), tiny_batch())
  assert tree_equal(a.params, b.params)


@pytest.mark.parametrize('model', ['mlp', 'cnn'])
def test_loss_gradients_match_finite_differences(model):
  task = tiny_task(model, classes=3)
  batch = tiny_batch(n=4, shape=(4, 4, 1), classes=3, weight=True)
  state = task.init(jax.random.key(0), batch)
  params64 = jax.tree.map(lambda p: np.asarray(p, np.float64), state.params)
  batch64 = dict(batch, x=batch['x'].astype(np.float64), weight=batch['weight'].astype(np.float64))

  with jax.enable_x64(True):
    task64 = dataclasses.replace(task, model=task.model.clone(dtype=jnp.float64,
                                                              param_dtype=jnp.float64))
    def f64(params):
      loss, _ = task64.compute_loss(params, state.model_state, batch64, None, train=False)
      return loss
    # Modes: reverse-mode against central differences, order 1, eps 1e-4, float64.
    check_grads(f64, (params64,), order=1, modes=('rev',), eps=1e-4, atol=1e-6, rtol=1e-5)


def test_no_host_transfer_inside_the_step():
  task = tiny_task('resnet')
  batch = jax.device_put(tiny_batch())
  state = task.init(jax.random.key(0), batch)
  step = jax.jit(task.step, donate_argnums=0)
  with jax.transfer_guard('disallow'):
    for _ in range(2):
      state, m = step(state, batch)
  assert int(state.step) == 2


def test_dropout_masks_differ_between_steps_and_are_pure_in_seed_and_step():
  task = tiny_task('mlp', dropout_rate=0.5)
  batch = tiny_batch()
  state = task.init(jax.random.key(0), batch)

  def outputs(state):
    _, aux = task.compute_loss(state.params, state.model_state, batch, state.step_key(), train=True)
    return np.asarray(aux['outputs'])

  at0 = outputs(state)
  at1 = outputs(state.replace(step=jnp.int32(1)))
  assert not np.array_equal(at0, at1), 'dropout mask must change with the step'
  again = task.init(jax.random.key(0), batch)
  np.testing.assert_array_equal(at0, outputs(again))
  other_seed = task.init(jax.random.key(1), batch).replace(params=state.params)
  assert not np.array_equal(at0, outputs(other_seed))
  # Evaluation is deterministic: no dropout.
  e1 = task.predict(state, batch['x'])
  e2 = task.predict(state.replace(step=jnp.int32(7)), batch['x'])
  np.testing.assert_array_equal(e1, e2)


def test_batchnorm_statistics_change_in_training_not_in_evaluation():
  task = tiny_task('resnet')
  batch = tiny_batch()
  state = task.init(jax.random.key(0), batch)
  trained, _ = jax.jit(task.step)(state, batch)
  assert params_differ(state.model_state, trained.model_state)
  _, aux = task.compute_loss(trained.params, trained.model_state, batch, None, train=False)
  assert tree_equal(aux['model_state'], trained.model_state)
  jax.jit(task.evaluate)(trained, batch)
  assert tree_equal(aux['model_state'], trained.model_state)


def test_bfloat16_params_keep_float32_adam_hyperparameters():
  model = pnn.MLP(num_classes=10, features=(16,), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  task = purax.Task(model=model, tx=purax.adamw(learning_rate=1e-3, b2=0.999, total_steps=10))
  batch = tiny_batch()
  state = task.init(jax.random.key(0), batch)
  assert all(p.dtype == jnp.bfloat16 for p in jax.tree.leaves(state.params))
  hp = state.opt_state.hyperparams
  assert all(v.dtype == jnp.float32 for v in hp.values())
  assert float(hp['b2']) == pytest.approx(0.999, rel=1e-6)  # bf16 would round to 1.0
  step = jax.jit(task.step)
  for _ in range(3):
    state, m = step(state, batch)
  assert all(bool(jnp.all(jnp.isfinite(p.astype(jnp.float32))))
             for p in jax.tree.leaves(state.params))
  assert np.isfinite(metrics.compute(m)['loss'])


def test_weighted_loss_ignores_zero_weight_examples():
  task = tiny_task()
  batch = tiny_batch(n=6)
  state = task.init(jax.random.key(0), batch)
  first4 = {k: v[:4] for k, v in batch.items()}
  padded = dict(batch, weight=np.array([1, 1, 1, 1, 0, 0], np.float32))
  loss4, _ = task.compute_loss(state.params, state.model_state, first4, None, train=False)
  loss_p, _ = task.compute_loss(state.params, state.model_state, padded, None, train=False)
  np.testing.assert_allclose(loss4, loss_p, rtol=1e-6)


@pytest.mark.parametrize('mutate, match', [
    (lambda b: dict(b, y=b['y'].astype(np.float32)), r"batch\['y'\].dtype: expected an integer"),
    (lambda b: {'x': b['x']}, r"batch\['y'\]: expected present"),
    (lambda b: dict(b, y=b['y'][:3]), r"batch\['y'\].shape: expected \[8\]"),
    (lambda b: {'y': b['y']}, r"batch\['x'\]: expected present"),
    (lambda b: dict(b, weight=b['y'][:3].astype(np.float32)), r"batch\['weight'\].shape: expected \[8\]"),
])
def test_malformed_batches_raise_named_errors(mutate, match):
  task = tiny_task()
  with pytest.raises(purax.DataError, match=match):
    task.init(jax.random.key(0), mutate(tiny_batch()))


@pytest.mark.parametrize('model, built, given', [
    ('cnn', (8, 8, 1), (8, 8, 3)),           # flax: ScopeParamShapeError for Conv_0's kernel
    ('mlp', (8, 8, 1), (4, 4, 1)),           # flax: the same for Dense_0's kernel
    ('functions', (6,), (5,)),               # plain functions: a dot_general shape error
])
def test_a_batch_of_another_shape_on_the_jit_path_is_a_data_error_naming_the_field(
    model, built, given):
  """Issue 29.5: the README's `jax.jit(task.step)` path names the batch field and
  both shapes, not the model's error about a parameter (kept as the cause)."""
  if model == 'functions':
    net = purax.Functions(lambda key, x: {'w': jnp.zeros((x.shape[-1], 10))},
                          lambda params, x: x @ params['w'])
    task = purax.Task(model=net, tx=purax.adamw(learning_rate=1e-3, total_steps=10))
  else:
    task = tiny_task(model)
  state = jax.jit(task.init)(jax.random.key(0), tiny_batch(shape=built))
  wrong = tiny_batch(n=5, shape=given)
  dims = ', '.join(map(str, built))
  for fn in (jax.jit(task.step), jax.jit(task.evaluate), jax.jit(task.predict)):
    with pytest.raises(purax.DataError) as e:
      fn(state, wrong)
    assert str(e.value) == (f"batch['x'].shape: expected [batch, {dims}] (the batch task.init "
                            f'built the params from), got {(5, *given)}')
    assert e.value.__cause__ is not None
  assert task.predict(state, tiny_batch(n=3, shape=built)['x']).shape == (3, 10)  # any batch size


def test_bad_task_config_raises():
  with pytest.raises(purax.ConfigError, match='loss: expected a function'):
    purax.Task(model=pnn.MLP(num_classes=2), tx=purax.adamw(total_steps=1), loss='rank')
  with pytest.raises(purax.ConfigError, match=r"hparams\['label_smoothing'\]: expected in \[0, 1\), got 1.5"):
    purax.Task(model=pnn.MLP(num_classes=2), tx=purax.adamw(total_steps=1),
               hparams={'label_smoothing': 1.5})
  with pytest.raises(purax.ConfigError, match='model: expected a flax.linen Module'):
    purax.Task(model=object(), tx=purax.adamw(total_steps=1))


def test_regression_objective():
  model = pnn.MLP(num_classes=2, features=(8,))
  task = purax.Task(model=model, tx=purax.adamw(learning_rate=1e-2, total_steps=50),
                    loss=purax.objectives.regression)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(16, 3)).astype(np.float32)
  batch = {'x': x, 'y': np.stack([x.sum(1), x[:, 0]], 1).astype(np.float32)}
  state = task.init(jax.random.key(0), batch)
  step = jax.jit(task.step)
  state, first = step(state, batch)
  for _ in range(30):
    state, last = step(state, batch)
  assert metrics.compute(last)['loss'] < metrics.compute(first)['loss']
  assert 'accuracy' not in last
