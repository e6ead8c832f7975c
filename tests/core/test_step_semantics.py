"""What one optimizer step means, tested against independent references:
per-forward model state follows the step (not the microbatch), the applied
loss scale is the state's whatever the batch size, and the dropout key is
folded with the step and with the microbatch."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import purax
from purax import nn as pnn
from purax.core import metrics as metrics_lib
from purax.core.precision import get_policy


def resnet_task(**kw):
  return purax.Task(model=pnn.ResNet(num_classes=4, stage_features=(4,)),
                    tx=optax.sgd(0.0), **kw)


def image_batch(n, seed=0):
  rng = np.random.default_rng(seed)
  return {'x': (rng.normal(size=(n, 6, 6, 1)) * 2.0 + 1.0).astype(np.float32),
          'y': rng.integers(0, 4, n).astype(np.int32)}


def running_means(state):
  return {'/'.join(str(k.key) for k in path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(state.model_state)[0]
          if path[-1].key == 'mean'}


@pytest.mark.parametrize('k', [2, 4])
def test_running_means_after_a_k_microbatch_step_equal_the_one_batch_step(k):
  """BatchNorm momentum 0.9: one step moves the running mean by 0.1 of the batch
  mean (not 1 - 0.9**k); reference: the same step without accumulation."""
  batch = image_batch(16)
  whole, split = resnet_task(), resnet_task(microbatches=k)
  state = whole.init(jax.random.key(0), batch)
  with jax.default_matmul_precision('highest'):
    one, _ = jax.jit(whole.step)(state, batch)
    acc, _ = jax.jit(split.step)(state, batch)
  before, first, accumulated = running_means(state), running_means(one), running_means(acc)
  stem = 'batch_stats/BatchNorm_0/mean'    # its input is conv(x): no earlier normalisation
  np.testing.assert_allclose(accumulated[stem], first[stem], rtol=1e-5, atol=1e-7)
  # Deeper layers see activations normalised with each microbatch's own
  # statistics (as in any accumulation), so their means differ a little; the
  # step's move must still be the one-batch move (0.1 of the batch mean), not
  # 1 - 0.9**k of it (3.4x at k = 4).
  for name in first:
    move_one, move_acc = first[name] - before[name], accumulated[name] - before[name]
    assert np.max(np.abs(move_acc - move_one)) <= 0.1 * np.max(np.abs(move_one)) + 1e-6, name
  assert np.max(np.abs(first[stem] - before[stem])) > 1e-3


def test_microbatch_running_state_weights_padding_out():
  """An all-padding microbatch (weight 0) does not pull the running statistics."""
  batch = image_batch(8)
  padded = {'x': np.concatenate([batch['x'], np.zeros_like(batch['x'])]),
            'y': np.concatenate([batch['y'], batch['y']]),
            'weight': np.concatenate([np.ones(8, np.float32), np.zeros(8, np.float32)])}
  state = resnet_task().init(jax.random.key(0), batch)
  with jax.default_matmul_precision('highest'):
    real, _ = jax.jit(resnet_task().step)(state, batch)
    split, _ = jax.jit(resnet_task(microbatches=2).step)(state, padded)
  stem = 'batch_stats/BatchNorm_0/mean'
  np.testing.assert_allclose(running_means(split)[stem], running_means(real)[stem],
                             rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('n', [8, 64, 256])
def test_the_applied_loss_scale_is_the_states_whatever_the_batch_size(n):
  """float16 compute, initial scale 2**15: the scaled mean loss does not overflow,
  so no step of a healthy run is skipped at any batch size (it was loss x batch
  weight x scale before)."""
  policy = get_policy('params=float32,compute=float16,output=float32')
  model = pnn.MLP(num_classes=5, features=(32,), **policy.model_kwargs())
  task = purax.Task(model=model, tx=purax.adamw(learning_rate=1e-3, total_steps=10),
                    loss_scale=2.0 ** 15)
  rng = np.random.default_rng(0)
  batch = {'x': rng.normal(size=(n, 6)).astype(np.float32),
           'y': rng.integers(0, 5, n).astype(np.int32)}
  state = task.init(jax.random.key(0), batch)
  step = jax.jit(task.step)
  skipped = 0.0
  for _ in range(3):
    state, m = step(state, batch)
    skipped += metrics_lib.compute(m)['skipped']
  assert skipped == 0
  assert float(state.loss_scale.scale) == 2.0 ** 15


def test_scaled_gradients_equal_unscaled_ones_for_any_batch_size():
  """grad(scale * mean loss) / scale == grad(mean loss) for a power of two under
  accumulation (exact arithmetic; XLA may fuse the two programs' sums in another
  order, so to 1 ulp), the scale not multiplied by the weight."""
  task = purax.Task(model=pnn.MLP(num_classes=5, features=(16,)),
                    tx=purax.adamw(learning_rate=1e-3, total_steps=10))
  scaled = dataclasses.replace(task, loss_scale=2.0 ** 10, microbatches=2)
  plain = dataclasses.replace(task, microbatches=2)
  rng = np.random.default_rng(1)
  batch = {'x': rng.normal(size=(32, 6)).astype(np.float32),
           'y': rng.integers(0, 5, 32).astype(np.int32)}
  s1 = plain.init(jax.random.key(0), batch)
  s2 = scaled.init(jax.random.key(0), batch)
  g1 = jax.jit(lambda s: plain.gradients(s, batch)[0])(s1)
  g2 = jax.jit(lambda s: scaled.gradients(s, batch)[0])(s2)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def dropout_task(**kw):
  return purax.Task(model=pnn.MLP(num_classes=3, features=(64,), dropout_rate=0.5),
                    tx=optax.sgd(0.1), **kw)


def test_the_step_folds_the_dropout_key_with_the_step():
  """Through task.step: the same params and batch at steps 0 and 1 give
  different updates (another dropout mask), and the same step gives the same."""
  task = dropout_task()
  batch = {'x': np.ones((8, 6), np.float32), 'y': np.zeros(8, np.int32)}
  state = task.init(jax.random.key(0), batch)
  step = jax.jit(task.step)
  a, _ = step(state, batch)
  b, _ = step(state.replace(step=jnp.int32(1)), batch)
  again, _ = step(state, batch)
  leaf = lambda s: np.asarray(s.params['Dense_0']['kernel'])
  assert not np.array_equal(leaf(a), leaf(b))
  np.testing.assert_array_equal(leaf(a), leaf(again))


def test_each_microbatch_gets_its_own_dropout_key():
  """Two identical halves: with distinct keys per microbatch the accumulated
  gradient differs from the gradient of one half under one key."""
  task = dropout_task(microbatches=2)
  half = {'x': np.ones((4, 6), np.float32), 'y': np.zeros(4, np.int32)}
  batch = jax.tree.map(lambda a: np.concatenate([a, a]), half)
  state = task.init(jax.random.key(0), batch)
  acc = jax.jit(lambda s: task.gradients(s, batch)[0])(state)
  key0 = jax.random.fold_in(state.step_key(), 0)
  one = jax.jit(jax.grad(lambda p: task.compute_loss(p, {}, half, key0)[0]))(state.params)
  assert not np.allclose(np.asarray(acc['Dense_0']['kernel']),
                         np.asarray(one['Dense_0']['kernel']))
