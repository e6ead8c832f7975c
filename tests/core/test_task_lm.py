"""The 'language_model' objective of Task: per-token float32 cross-entropy, weights,
metrics (loss, accuracy, bits per byte, tokens), batch checks."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import purax
from purax.core import losses
from purax.core import metrics as metrics_lib
from purax.nn.transformer import DecoderLM

MODEL = DecoderLM(d_model=32, num_layers=2, num_heads=4, max_len=16)
TASK = purax.Task(model=MODEL, tx=purax.adamw(learning_rate=1e-3, total_steps=10),
                  loss=purax.objectives.language_model)


def lm_batch(seed=0, n=4, seq=16, weight=None):
  rng = np.random.default_rng(seed)
  window = rng.integers(0, 256, size=(n, seq + 1)).astype(np.int32)
  batch = {'x': window[:, :-1], 'y': window[:, 1:]}
  if weight is not None:
    batch['weight'] = weight
  return batch


@pytest.fixture(scope='module')
def state():
  return jax.jit(TASK.init)(jax.random.key(0), lm_batch())


def test_loss_is_the_weighted_mean_token_cross_entropy(state):
  weight = np.ones((4, 16), np.float32)
  weight[0, 8:] = 0.0      # padded tokens
  weight[3] = 0.0          # a padded sequence
  batch = lm_batch(weight=weight)
  loss, aux = jax.jit(lambda b: TASK.compute_loss(state.params, {}, b, None, train=False))(batch)
  logits = MODEL.apply({'params': state.params}, batch['x']).astype(jnp.float32)
  per_token = optax.softmax_cross_entropy_with_integer_labels(logits, batch['y'])
  expected = float(jnp.sum(per_token * weight) / weight.sum())
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  m = metrics_lib.compute(aux['metrics'])
  np.testing.assert_allclose(m['loss'], expected, rtol=1e-5)
  np.testing.assert_allclose(m['bits_per_byte'], expected / math.log(2), rtol=1e-5)
  assert m['tokens'] == weight.sum() == 40 and m['examples'] == 3
  correct = np.asarray(jnp.argmax(logits, -1) == batch['y'], np.float32)
  np.testing.assert_allclose(m['accuracy'], (correct * weight).sum() / weight.sum(), rtol=1e-6)
  assert aux['values'].shape == (4, 16)
  # An untrained byte model is close to uniform: ~8 bits per byte.
  assert 7.5 < m['bits_per_byte'] < 8.5
  # Label smoothing changes the loss, not the bits per byte (a likelihood).
  smoothed = jax.jit(lambda b: TASK.compute_loss(state.params, {}, b, None, train=False,
                                         hparams={'label_smoothing': jnp.float32(0.5)}))(batch)
  ms = metrics_lib.compute(smoothed[1]['metrics'])
  assert abs(ms['loss'] - m['loss']) > 1e-3
  np.testing.assert_allclose(ms['bits_per_byte'], m['bits_per_byte'], rtol=1e-6)


def test_per_sequence_weights_equal_the_same_per_token_weights(state):
  seq_weight = np.array([1.0, 0.0, 0.5, 1.0], np.float32)
  ev = jax.jit(TASK.evaluate)
  a = metrics_lib.compute(ev(state, lm_batch(weight=seq_weight)))
  b = metrics_lib.compute(ev(state, lm_batch(weight=np.repeat(seq_weight[:, None], 16, 1))))
  for key in a:
    np.testing.assert_allclose(a[key], b[key], rtol=1e-6)


def test_token_cross_entropy_with_smoothing_equals_the_one_hot_form():
  logits = jax.random.normal(jax.random.key(0), (3, 5, 11))
  labels = jax.random.randint(jax.random.key(1), (3, 5), 0, 11)
  for s in (0.0, 0.1):
    expected = losses.softmax_cross_entropy(logits.reshape(15, 11), labels.reshape(15), s)
    np.testing.assert_allclose(losses.token_cross_entropy(logits, labels, s).reshape(15),
                               expected, rtol=1e-5, atol=1e-6)


def test_a_step_trains_and_keeps_params_float32(state):
  step = jax.jit(TASK.step)
  batch = lm_batch(1)
  new, metrics = step(state, batch)
  assert int(new.step) == 1
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(new.params))
  assert set(metrics) >= {'loss', 'accuracy', 'bits_per_byte', 'tokens', 'grad_norm'}


@pytest.mark.parametrize('change, message', [
    (dict(y=np.zeros((4, 15), np.int32)), r"batch\['y'\].shape: expected \[4, 16\] \(next-token ids, matching the model outputs \[4, 16, 256\]\), got \[4, 15\]"),
    (dict(y=np.zeros((4, 16), np.float32)), r"batch\['y'\].dtype: expected an integer dtype \(token ids\), got float32"),
    (dict(weight=np.ones((4, 3), np.float32)), r"batch\['weight'\].shape: expected \[4\] or \[4, 16\], got \[4, 3\]"),
])
def test_malformed_language_model_batches_name_the_field(change, message):
  batch = {**lm_batch(), **change}
  with pytest.raises(purax.DataError, match=message):
    TASK.check_batch(batch)


def test_classification_loss_on_sequence_logits_names_the_outputs():
  task = purax.Task(model=MODEL, tx=TASK.tx)
  with pytest.raises(purax.DataError, match=r"model outputs: expected \[batch, classes\] logits"):
    task.check_batch(lm_batch())


def test_accumulating_microbatches_equals_the_whole_batch_with_token_weights(state):
  """The loss normaliser is the token weight, so uneven padding across
  microbatches still gives the whole batch's update."""
  weight = np.ones((4, 16), np.float32)
  weight[0, 4:] = 0.0
  weight[3, 1:] = 0.0
  batch = lm_batch(2, weight=weight)
  split = purax.Task(model=MODEL, tx=TASK.tx, loss=purax.objectives.language_model, microbatches=2)
  grads = lambda task: jax.jit(lambda s, b: task.gradients(s, b)[0])(state, batch)
  with jax.default_matmul_precision('highest'):
    whole, parts = grads(TASK), grads(split)
  for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(parts)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)
