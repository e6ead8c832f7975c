"""Task(eval_params=...): evaluation, prediction, the best-k checkpoints and an
EMA use the evaluation params (a schedule-free optimizer's average x), and
schedule-free AdamW trained by purax.fit on digits is optax's reference loop."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import purax
from purax.core.precision import standard_promotion
from purax.core.optimizers import schedule_free_eval_params
from purax.io import datasets, pipeline

STEPS, BATCH, EVERY = 12, 32, 6


@pytest.fixture(scope='module')
def digits():
  ds = datasets.load('digits')
  return (pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=BATCH, seed=0,
                                 num_steps=STEPS),
          list(pipeline.eval_batches(ds.x_test, ds.y_test, batch_size=360)))


def test_schedule_free_adamw_on_digits_is_optaxs_reference_loop_evaluated_at_x(digits,
                                                                               tmp_path):
  """optax's loop (the optax.contrib.schedule_free_adamw docstring): grads at
  the params y, evaluation at schedule_free_eval_params(opt_state, y). purax's
  fit with Task(eval_params=...) ends with the same y and x (rtol 1e-5: the
  same float32 computation; purax reduces the loss by its contract, sum of
  weighted values over the weight, the reference by jnp.mean), its eval/*
  and the best-k checkpoint's metrics are x's, predict is x's, and an EMA
  with params_of=task.evaluation_params averages x."""
  train, test = digits
  tx = optax.contrib.schedule_free_adamw(1e-2, warmup_steps=4)
  model = purax.nn.MLP(num_classes=10, features=(32,))
  task = purax.Task(model=model, tx=tx, eval_params=schedule_free_eval_params)
  state = jax.jit(task.init)(jax.random.key(0), train[0])
  params = jax.tree.map(jnp.copy, state.params)     # fit donates the state
  opt_state = tx.init(params)
  ema = purax.hooks.EMA(decay=0.0, params_of=task.evaluation_params)
  with purax.Checkpointer(str(tmp_path), keep_last=1, keep_best=1, best_metric='eval/loss',
                          best_mode='min') as ckpt, jax.default_matmul_precision('highest'):
    state, history = purax.fit(task, state, train, hooks=purax.hooks.standard(
        log_every=EVERY, eval_data=test, eval_every=EVERY, checkpointer=ckpt,
        checkpoint_every=EVERY, progress=False) + [ema])
    kept = ckpt.steps()

    @jax.jit
    def loss(p, batch):
      logits = model.apply({'params': p}, batch['x'].reshape(len(batch['x']), -1))
      return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch['y']))

    @jax.jit
    def reference_step(params, opt_state, batch):
      updates, opt_state = standard_promotion(tx.update)(jax.grad(loss)(params, batch), opt_state,
                                                         params)
      return optax.apply_updates(params, updates), opt_state

    evaluated = {}
    for s in range(STEPS):
      params, opt_state = reference_step(params, opt_state, train[s])
      if (s + 1) % EVERY == 0:
        x = optax.contrib.schedule_free_eval_params(opt_state, params)
        evaluated[s + 1] = (float(loss(x, test[0])), float(loss(params, test[0])))
  x = optax.contrib.schedule_free_eval_params(opt_state, params)
  for ours, theirs in ((state.params, params), (task.evaluation_params(state), x),
                       (ema.params, x)):
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  logged = {r['step']: r['eval/loss'] for r in history if 'eval/loss' in r}
  assert sorted(logged) == sorted(evaluated)
  for step, (at_x, at_y) in evaluated.items():
    assert logged[step] == pytest.approx(at_x, rel=1e-5)
    assert abs(at_x - at_y) > 1e-3      # x and y differ: the test can tell them apart
  best = min(evaluated, key=lambda s: evaluated[s][0])     # by x's loss: kept
  assert best in kept and len(kept) <= 2
  assert ckpt.read_extra(best)['metrics']['eval/loss'] == pytest.approx(evaluated[best][0],
                                                                        rel=1e-5)
  logits = jax.jit(task.predict)(state, test[0])
  np.testing.assert_allclose(logits, model.apply({'params': x}, test[0]['x'].reshape(360, -1)),
                             rtol=1e-4, atol=1e-5)


def test_without_eval_params_evaluation_is_at_the_params_and_a_bad_option_is_named():
  model = purax.nn.MLP(num_classes=3, features=(4,))
  batch = {'x': np.ones((2, 5), np.float32), 'y': np.zeros(2, np.int32)}
  task = purax.Task(model=model, tx=optax.sgd(0.1))
  state = task.init(jax.random.key(0), batch)
  assert task.evaluation_params(state) is state.params
  shifted = dataclasses.replace(task, eval_params=lambda s: jax.tree.map(jnp.zeros_like,
                                                                          s.params))
  np.testing.assert_array_equal(shifted.predict(state, batch), np.zeros((2, 3)))
  with pytest.raises(purax.ConfigError, match='eval_params: expected None or a function'):
    purax.Task(model=model, tx=optax.sgd(0.1), eval_params='x')
