"""Rotary position embeddings against independent references (issue 14, item 10a).

- A known answer: the frequency table of Su et al. 2021 (RoFormer, eq. 15),
  ``theta_i = base^(-2i / d)``, and the rotation of the "rotate half" pairs
  (GPT-NeoX / LLaMA): ``(x_i, x_{i+d/2})`` turned by ``p * theta_i``.
- The analytic property that makes rotary embeddings relative: the score
  ``<R_m q, R_n k>`` depends only on ``m - n``.
- Through the model: :class:`SelfAttention` with ``rope=True`` gives scores
  that are unchanged when every position is shifted.

Tolerances: float32 angles of at most 200 radians (error ~1e-5).
"""

import jax
import jax.numpy as jnp
import numpy as np

from purax.nn.attention import apply_rope, rope_angles

HEAD_DIM = 8


def test_frequency_table_is_roformers():
  positions = jnp.asarray([[0, 1, 3, 50]], jnp.int32)
  cos, sin = rope_angles(positions, HEAD_DIM, base=10000.0)
  assert cos.shape == sin.shape == (1, 4, 1, HEAD_DIM // 2)
  theta = np.asarray([1.0, 0.1, 0.01, 0.001])   # 10000 ** (-2i / 8), i = 0..3
  angles = np.asarray([0, 1, 3, 50], np.float64)[:, None] * theta[None]
  np.testing.assert_allclose(cos[0, :, 0], np.cos(angles), atol=1e-6)
  np.testing.assert_allclose(sin[0, :, 0], np.sin(angles), atol=1e-6)
  cos, sin = rope_angles(positions, HEAD_DIM, base=100.0)
  np.testing.assert_allclose(sin[0, 3, 0], np.sin(50 * 100.0 ** (-np.arange(4) / 4)),
                             atol=1e-6)


def test_rotation_pairs_the_two_halves():
  p = 7
  cos, sin = rope_angles(jnp.asarray([[p]], jnp.int32), HEAD_DIM)
  theta = 10000.0 ** (-np.arange(4) * 2 / HEAD_DIM)
  x = np.arange(1, HEAD_DIM + 1, dtype=np.float32)[None, None, None]   # [1, 1, 1, 8]
  got = np.asarray(apply_rope(jnp.asarray(x), cos, sin))[0, 0, 0]
  a, b = x[0, 0, 0, :4].astype(np.float64), x[0, 0, 0, 4:].astype(np.float64)
  c, s = np.cos(p * theta), np.sin(p * theta)
  np.testing.assert_allclose(got, np.concatenate([a * c - b * s, b * c + a * s]), rtol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(got), np.linalg.norm(x), rtol=1e-6)   # a rotation


def _score(q, k, m, n):
  cm, sm = rope_angles(jnp.asarray([[m]], jnp.int32), HEAD_DIM)
  cn, sn = rope_angles(jnp.asarray([[n]], jnp.int32), HEAD_DIM)
  return float(jnp.sum(apply_rope(q, cm, sm) * apply_rope(k, cn, sn)))


def test_scores_depend_only_on_the_relative_position():
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(1, 1, 1, HEAD_DIM)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(1, 1, 1, HEAD_DIM)), jnp.float32)
  for m, n in [(5, 2), (9, 9), (0, 7)]:
    base = _score(q, k, m, n)
    for shift in (1, 13, 150):
      np.testing.assert_allclose(_score(q, k, m + shift, n + shift), base, atol=1e-4)
  assert abs(_score(q, k, 5, 2) - _score(q, k, 6, 2)) > 1e-3   # and does depend on m - n


def test_self_attention_with_rope_is_shift_invariant():
  from purax.nn.attention import SelfAttention
  layer = SelfAttention(num_heads=2, rope=True, causal=True)
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(1, 6, 2 * HEAD_DIM)), jnp.float32)
  positions = jnp.arange(6, dtype=jnp.int32)[None]
  # Weights of standard deviation 1 (not 0.02): scores far from uniform attention.
  params = jax.tree.map(lambda w: w * 50.0, layer.init(jax.random.key(0), x, positions))
  with jax.default_matmul_precision('highest'):
    base = layer.apply(params, x, positions)
    shifted = layer.apply(params, x, positions + 37)
    scrambled = layer.apply(params, x, positions * 2)
  scale = float(np.max(np.abs(base)))
  np.testing.assert_allclose(shifted, base, atol=1e-5 * scale)
  assert float(np.max(np.abs(scrambled - base))) > 0.01 * scale   # positions do matter
