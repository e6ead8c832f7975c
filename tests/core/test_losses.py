"""The chunked LM loss (purax.core.losses.chunked_token_losses): the plain
loss, metrics and gradients to float32 rounding, without the [batch, seq,
vocab] logits in the step's temporaries."""

import jax
import numpy as np
import pytest

import purax
from purax.core import losses
from purax.nn.transformer import DecoderLM

RNG = np.random.default_rng(0)
VOCAB = 2048


def lm_task(chunk):
  model = DecoderLM(vocab_size=VOCAB, d_model=16, num_layers=1, num_heads=2, max_len=32,
                    logits_chunk=chunk)
  return purax.Task(model=model, tx=purax.adamw(learning_rate=1e-2, total_steps=10),
                    loss=purax.objectives.language_model, hparams={'label_smoothing': 0.1})


@pytest.fixture(scope='module')
def plain():
  """Gradients, metrics and temporary bytes of the full-logits loss."""
  tokens = RNG.integers(0, VOCAB, (6, 33)).astype(np.int32)
  batch = {'x': tokens[:, :-1], 'y': tokens[:, 1:],
           'weight': RNG.uniform(0, 1, (6, 32)).astype(np.float32)}
  return batch, *gradients(lm_task(0), batch)


def gradients(task, batch):
  state = jax.jit(task.init)(jax.random.key(0), batch)   # one compilation, not op by op
  compiled = jax.jit(task.gradients).lower(state, batch).compile()
  grads, metrics, _ = compiled(state, batch)
  return grads, purax.metrics.compute(metrics), compiled.memory_analysis().temp_size_in_bytes


# 192 tokens: chunks of 64 divide them, chunks of 40 leave a padded last chunk.
@pytest.mark.parametrize('chunk', [64, 40])
def test_the_chunked_loss_is_the_plain_loss_without_its_logits_in_memory(plain, chunk):
  batch, grads, metrics, temp = plain
  chunked_grads, chunked_metrics, chunked_temp = gradients(lm_task(chunk), batch)
  # float32 throughout: the same per-token arithmetic; the embedding's gradient
  # is summed chunk by chunk (relative differences ~3e-7 measured).
  for name in metrics:
    np.testing.assert_allclose(chunked_metrics[name], metrics[name], rtol=1e-5, err_msg=name)
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(chunked_grads)[0],
                          jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * np.abs(b).max(),
                               err_msg=jax.tree_util.keystr(path))
  # The plain step's temporaries hold [192, 2048] float32 logits (1.5 MiB) more
  # than twice over (3.4 MiB measured); the chunked one's a [64, 2048] chunk
  # (1.4 MiB in all).
  logits = 192 * VOCAB * 4
  assert temp > 2 * logits and chunked_temp < temp - logits, (temp, chunked_temp)


def test_chunked_logits_say_their_shape_and_give_the_full_logits():
  hidden = RNG.normal(size=(2, 5, 4)).astype(np.float32)
  table = RNG.normal(size=(7, 4)).astype(np.float32)
  out = losses.ChunkedLogits(hidden, table, chunk=3)
  assert out.shape == (2, 5, 7) and out.ndim == 3
  np.testing.assert_allclose(out.logits(), hidden @ table.T, rtol=1e-6)
  labels = RNG.integers(0, 7, (2, 5))
  for a, b in zip(losses.chunked_token_losses(out, labels, 0.2),
                  losses.token_losses(out.logits(), labels, 0.2)):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  with pytest.raises(purax.ConfigError, match='logits_chunk: expected an integer >= 0'):
    DecoderLM(vocab_size=7, logits_chunk=-1).init(jax.random.key(0), labels)
