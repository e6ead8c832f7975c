"""Statistics against a float64 reference on adversarial inputs (issue 14, item 9).

Each computes from float32 (or bfloat16) inputs; the reference computes from
the same values cast to float64, so only the method's own error is measured.
Tolerances: the variance to 1e-3 relative (a two-pass float32 variance of
1e4 + N(0, 0.1) is good to ~1e-5; the one-pass E[x^2] - E[x]^2 is off by
100% or more); normalized outputs to 0.05 absolute (the float32 spacing at
1e4 is 1e-3, a 0.01 error after dividing by the spread of 0.1); norms and
losses to 1e-5 relative.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from purax.core import losses, metrics, optim
from purax.nn import transformer
from purax.nn.norm import BatchNorm, masked_moments

RNG = np.random.default_rng(0)
OFFSET = (1e4 + 0.1 * RNG.normal(size=(256, 8))).astype(np.float32)


def _normalized64(x, axis):
  x = np.asarray(x, np.float64)
  return (x - x.mean(axis, keepdims=True)) / np.sqrt(x.var(axis, keepdims=True) + 1e-5)


def test_batchnorm_variance_survives_a_large_offset():
  mean, var, _ = masked_moments(jnp.asarray(OFFSET))
  ref = OFFSET.astype(np.float64)
  np.testing.assert_allclose(var, ref.var(0), rtol=1e-3)
  np.testing.assert_allclose(mean, ref.mean(0), rtol=2.5e-7)   # two float32 ulps
  bn = BatchNorm()
  y, _ = bn.apply(bn.init(jax.random.key(0), OFFSET), OFFSET, mutable=['batch_stats'])
  np.testing.assert_allclose(y, _normalized64(OFFSET, 0), atol=0.05)


def test_batchnorm_moments_of_long_bfloat16_batches_are_float32():
  x = jnp.asarray(RNG.normal(size=(8192, 4)) * 2 + 3, jnp.bfloat16)
  mean, var, _ = masked_moments(x)
  ref = np.asarray(x, np.float64)
  np.testing.assert_allclose(mean, ref.mean(0), rtol=1e-5)
  np.testing.assert_allclose(var, ref.var(0), rtol=1e-5)


def test_transformer_layer_norm_survives_a_large_offset():
  ln = transformer.layer_norm(jnp.float32, jnp.float32)
  x = OFFSET.T                                       # [8, 256]: 256 features per row
  y = ln.apply(nn.unbox(ln.init(jax.random.key(0), x)), x)
  np.testing.assert_allclose(y, _normalized64(x, -1), atol=0.05)


def test_transformer_layer_norm_value_and_gradients_are_the_exact_two_pass_ones():
  # The row shift is a constant for differentiation: value and gradients
  # (input, scale, bias) are those of flax's exact two-pass LayerNorm, and
  # its parameters have the same names, shapes and initial values.
  x = jnp.asarray(RNG.normal(size=(4, 6, 32)) * 3 + 1, jnp.float32)
  cot = jnp.asarray(RNG.normal(size=x.shape), jnp.float32)
  ours = transformer.layer_norm(jnp.float32, jnp.float32)
  ref = nn.LayerNorm(epsilon=1e-5, use_fast_variance=False)
  params = nn.unbox(ours.init(jax.random.key(0), x))
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, ref.init(jax.random.key(0), x))
  params = jax.tree.map(lambda p: p + jnp.asarray(RNG.normal(size=p.shape), p.dtype), params)

  def grads(module):
    return jax.grad(lambda p, x: jnp.vdot(module.apply(p, x), cot), argnums=(0, 1))(params, x)

  np.testing.assert_allclose(ours.apply(params, x), ref.apply(params, x), rtol=1e-5, atol=1e-5)
  for got, want in zip(jax.tree.leaves(grads(ours)), jax.tree.leaves(grads(ref))):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  low = transformer.layer_norm(jnp.bfloat16, jnp.float32).apply(params, x)
  assert low.dtype == jnp.bfloat16


@pytest.mark.parametrize('form', ['branch', 'one pass'])
@pytest.mark.parametrize('magnitude', [1e20, 1e-25, 1.0])
def test_global_norm_neither_overflows_nor_underflows(magnitude, form, monkeypatch):
  # 'one pass' is the form a GPU runs (purax.core.loops.SELECT_PLATFORMS),
  # run here on the CPU: the same norm, and no conditional in the program.
  from purax.core import loops
  if form == 'one pass':
    monkeypatch.setattr(loops, 'SELECT_PLATFORMS', loops.SELECT_PLATFORMS + ('cpu',))
  tree = {'a': jnp.asarray(RNG.normal(size=(64,)) * magnitude, jnp.float32),
          'b': jnp.asarray(RNG.normal(size=(3, 5)) * magnitude, jnp.float32)}
  ref = np.sqrt(sum(np.sum(np.asarray(v, np.float64) ** 2) for v in tree.values()))
  np.testing.assert_allclose(optim.global_norm(tree), ref, rtol=1e-5)
  assert not np.isfinite(optim.global_norm({'a': jnp.float32([1.0, np.inf])}))
  assert np.isnan(optim.global_norm({'a': jnp.float32([1.0, np.nan])}))
  if magnitude == 1.0:
    hlo = jax.jit(lambda t: optim.global_norm(t)).lower(tree).compile().as_text()
    assert ('conditional(' in hlo) == (form == 'branch')


def test_clipping_a_huge_gradient_gives_max_norm_not_zero():
  g = {'w': jnp.asarray(RNG.normal(size=(16,)) * 1e20, jnp.float32)}
  clip = optim.clip_by_global_norm(jnp.float32(1.0))
  out, _ = clip.update(g, clip.init(g))
  np.testing.assert_allclose(optim.global_norm(out), 1.0, rtol=1e-5)
  direction = np.asarray(g['w'], np.float64) / np.linalg.norm(np.asarray(g['w'], np.float64))
  np.testing.assert_allclose(out['w'], direction, rtol=1e-5, atol=1e-7)


LOGITS = (1e4 + RNG.normal(size=(32, 4, 50))).astype(np.float32)
LABELS = RNG.integers(0, 50, size=(32, 4))


def _cross_entropy64(z, labels, s):
  z = np.asarray(z, np.float64)
  m = z.max(-1, keepdims=True)
  lse = (np.log(np.exp(z - m).sum(-1, keepdims=True)) + m)[..., 0]
  nll = lse - np.take_along_axis(z, labels[..., None], -1)[..., 0]
  return (1 - s) * nll + s * (lse - z.mean(-1)), nll


def test_softmax_cross_entropy_with_large_logit_offsets():
  got = losses.softmax_cross_entropy(jnp.asarray(LOGITS[:, 0]), jnp.asarray(LABELS[:, 0]), 0.1)
  want, _ = _cross_entropy64(LOGITS[:, 0], LABELS[:, 0], 0.1)
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_token_cross_entropy_with_large_logit_offsets():
  loss, nll = losses.token_cross_entropy_and_nll(jnp.asarray(LOGITS), jnp.asarray(LABELS), 0.1)
  want_loss, want_nll = _cross_entropy64(LOGITS, LABELS, 0.1)
  np.testing.assert_allclose(nll, want_nll, rtol=1e-5)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)


def test_metric_sums_of_long_bfloat16_values_are_float32():
  values = jnp.asarray(RNG.random(1 << 16) + 5.0, jnp.bfloat16)
  got = metrics.Average.of(values)
  ref = np.asarray(values, np.float64)
  np.testing.assert_allclose(got.total, ref.sum(), rtol=1e-6)
  assert float(got.count) == 1 << 16
  got = losses.softmax_cross_entropy(jnp.asarray(LOGITS[:, 0], jnp.bfloat16),
                                     jnp.asarray(LABELS[:, 0]))
  assert got.dtype == jnp.float32


def test_optax_global_norm_overflows_which_is_why_optim_has_its_own():
  """Documents the reference failure the fix is for (not purax code)."""
  assert not np.isfinite(optax.global_norm({'a': jnp.full((4,), 1e20, jnp.float32)}))


@pytest.mark.parametrize('s', [0.0, 0.1])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_token_losses_and_gradient_match_the_textbook_formula(s, dtype):
  # Both outputs that carry a gradient (the smoothed loss and the plain NLL)
  # against log_softmax with smoothed targets, values and gradients, in the
  # logits' dtype.
  rng = np.random.default_rng(1)
  z = jnp.asarray(3.0 * rng.normal(size=(3, 5, 17)), dtype)
  y = jnp.asarray(rng.integers(0, 17, size=(3, 5)), jnp.int32)
  a, b = (jnp.asarray(rng.normal(size=(3, 5)), jnp.float32) for _ in range(2))

  def reference(z):
    z = z.astype(jnp.float32)
    logp = jax.nn.log_softmax(z)
    nll = -jnp.take_along_axis(logp, y[..., None], -1)[..., 0]
    return jnp.sum(a * ((1 - s) * nll - s * logp.mean(-1)) + b * nll)

  def ours(z):
    loss, nll, _ = losses.token_losses(z, y, s)
    return jnp.sum(a * loss + b * nll)

  np.testing.assert_allclose(ours(z), reference(z), rtol=1e-5)
  got, want = jax.grad(ours)(z), jax.grad(reference)(z)
  assert got.dtype == dtype
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                             rtol=1e-2 if dtype == jnp.bfloat16 else 1e-5, atol=1e-6)


def test_token_losses_accuracy_is_the_argmax_one_and_zero_smoothing_adds_nothing():
  z = jnp.asarray(LOGITS)
  y = jnp.asarray(LABELS)
  loss, nll, correct = losses.token_losses(z, y, 0.0)
  np.testing.assert_array_equal(correct, (jnp.argmax(z, -1) == y).astype(jnp.float32))
  np.testing.assert_array_equal(loss, nll)            # bitwise: s = 0 adds exactly 0
  ties = jnp.zeros((2, 4))
  assert np.all(losses.token_losses(ties, jnp.asarray([1, 3]), 0.0)[2] == 1.0)  # ties count
