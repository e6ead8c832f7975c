"""The chunked LM loss (purax.core.losses.chunked_token_losses): the plain
loss, metrics and gradients to float32 rounding, without the [batch, seq,
vocab] logits in the step's temporaries."""

import jax
import jax.numpy as jnp
import jax.test_util  # noqa: F401  (check_grads)
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


# -- the token loss's one-pass gradient (losses.token_losses' custom VJP) -----

def reference_token_losses(logits, labels, s):
  """The formula before the custom VJP (commit 254d951), left to autodiff."""
  logits = losses.at_least_float32(logits)
  top = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  logits = logits - top
  lse = jnp.log(jnp.sum(jnp.exp(logits), axis=-1))
  picked = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
  s = jnp.asarray(s, logits.dtype)
  nll = lse - picked
  loss = (1.0 - s) * nll + s * (lse - jnp.mean(logits, axis=-1))
  correct = jax.lax.stop_gradient(picked >= 0).astype(jnp.float32)
  return loss, nll, correct, lse + top[..., 0]


def objective(token_losses):
  """A weighted loss with a z-loss and the NLL in it: every output's gradient flows."""
  def f(logits, labels, s, weight):
    loss, nll, _, log_z = token_losses(logits, labels, s)
    return jnp.sum(weight * (loss + 1e-2 * jnp.square(log_z) + 0.5 * nll))
  return f


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_token_losses_values_and_gradients_equal_the_autodiff_formula(dtype):
  logits = jnp.asarray(RNG.normal(size=(3, 5, 97)) * 4, dtype)
  labels = jnp.asarray(RNG.integers(0, 97, (3, 5)), jnp.int32)
  weight = jnp.asarray(RNG.uniform(size=(3, 5)) * (RNG.uniform(size=(3, 5)) > 0.2), jnp.float32)
  ours = lambda z, y, s: losses.token_losses(z, y, s, log_z=True)      # noqa: E731

  @jax.jit
  def run(s):
    values = ours(logits, labels, s), reference_token_losses(logits, labels, s)
    grads = (jax.grad(objective(ours), argnums=(0, 2))(logits, labels, s, weight),
             jax.grad(objective(reference_token_losses), argnums=(0, 2))(logits, labels, s,
                                                                         weight))
    # A population's label smoothing: vmapped, members' gradients apart.
    per_member = jax.vmap(jax.grad(objective(ours)), in_axes=(None, None, 0, None))(
        logits, labels, jnp.stack([s, 0.3]), weight)
    return values, grads, per_member

  for s in (0.0, 0.1):
    (got, want), (grad_got, grad_want), per_member = run(jnp.float32(s))
    # The same float32 arithmetic: equal to float32 rounding (bitwise on
    # XLA:CPU, measured; 1e-6 relative leaves XLA room to reassociate the
    # fused sums, e.g. at the label's entry, where autodiff adds the one-hot
    # term after the smoothing term and the custom VJP before).
    for a, b in zip(got, want):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    (dz, ds), (dz_want, ds_want) = grad_got, grad_want
    assert dz.dtype == dz_want.dtype == dtype and ds.dtype == jnp.float32
    dz, dz_want = np.asarray(dz, np.float32), np.asarray(dz_want, np.float32)
    tol = 1e-2 if dtype == jnp.bfloat16 else 1e-6    # one rounding to bfloat16 at the end
    np.testing.assert_allclose(dz, dz_want, rtol=tol, atol=tol * np.abs(dz_want).max())
    # d/ds sums g * (smooth - nll) over the 15 tokens where autodiff sums
    # g * smooth and -g * nll apart: terms of ~5 that cancel to ~1, so 1e-5.
    np.testing.assert_allclose(ds, ds_want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(per_member[0], np.float32),
                               np.asarray(grad_got[0], np.float32), rtol=1e-6, atol=1e-7)
  # s = 0 adds exactly nothing: the loss is bitwise the NLL.
  np.testing.assert_array_equal(run(jnp.float32(0.0))[0][0][0], run(jnp.float32(0.0))[0][0][1])


def test_token_losses_gradients_match_finite_differences():
  with jax.enable_x64(True):            # float64 throughout: at_least_float32 keeps it
    logits = jnp.asarray(RNG.normal(size=(2, 3, 7)) * 2, jnp.float64)
    labels = jnp.asarray(RNG.integers(0, 7, (2, 3)), jnp.int32)
    weight = jnp.asarray(RNG.uniform(size=(2, 3)), jnp.float64)
    f = objective(lambda z, y, s: losses.token_losses(z, y, s, log_z=True))
    for s in (0.0, 0.2):
      # Central differences of order 2 in float64 (eps 1e-4): ~1e-8 off.
      jax.test_util.check_grads(lambda z, s: f(z, labels, s, weight),
                                (logits, jnp.float64(s)), order=1, modes=['rev'],
                                eps=1e-4, atol=1e-6, rtol=1e-6)
