"""Float8 matmuls (purax.nn.fp8): the product of the scaled float8 operands,
close to the exact one; a float8 LM step lowers to float8 dots for CUDA and
trains on the CPU (XLA:CPU upcasts the float8 operands: the same products)."""

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purax
from purax.nn import fp8
from purax.nn.transformer import DecoderLM

RNG = np.random.default_rng(0)


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / np.linalg.norm(b)


def test_the_product_is_that_of_the_scaled_float8_operands_and_close_to_the_exact_one():
  x = jnp.asarray(RNG.normal(size=(3, 8, 64)) * 5, jnp.bfloat16)
  w = jnp.asarray(RNG.normal(size=(64, 32)) * 0.05, jnp.bfloat16)
  g = jnp.asarray(RNG.normal(size=(3, 8, 32)), jnp.bfloat16)
  @jax.jit      # one compilation, not op by op
  def run(x, w, g):
    y, vjp = jax.vjp(fp8.matmul, x, w)
    return (y, *vjp(g), *fp8.quantize(x, fp8.FORWARD), *fp8.quantize(w, fp8.FORWARD))

  y, dx, dw, qx, sx, qw, sw = run(x, w, g)
  assert (y.dtype, dx.dtype, dw.dtype) == (jnp.bfloat16,) * 3
  # Exactly the float8 values times their scales, summed (to bfloat16 rounding).
  assert qx.dtype == jnp.float8_e4m3fn and float(jnp.max(jnp.abs(qx.astype(jnp.float32)))) == 448
  want = (np.asarray(qx, np.float32) @ np.asarray(qw, np.float32)) * float(sx) * float(sw)
  np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
  # e4m3 keeps 3 mantissa bits, e5m2 2: a few percent of the exact product.
  xf, wf, gf = (np.asarray(a, np.float32) for a in (x, w, g))
  assert rel(y, xf @ wf) < 0.06
  assert rel(dx, gf @ wf.T) < 0.1
  assert rel(dw, xf.reshape(-1, 64).T @ gf.reshape(-1, 32)) < 0.1
  # Zeros stay zeros (scale 1); a non-finite input is not clipped to a finite
  # value: it reaches the output (and the non-finite guard) as NaN.
  matmul = jax.jit(fp8.matmul)
  assert not np.any(matmul(jnp.zeros_like(x), w))
  for bad in (np.inf, np.nan):
    out = matmul(x.at[0, 0, 0].set(bad), w)
    rows = np.asarray(out, np.float32).reshape(-1, out.shape[-1])
    assert np.isnan(rows[0]).all() and np.isfinite(rows[1:]).all()


@pytest.fixture(scope='module')
def lm_task():
  def task(fp8_on, num_layers=1, scan_layers=None):
    model = DecoderLM(vocab_size=64, d_model=32, num_layers=num_layers, num_heads=4, max_len=16,
                      dtype=jnp.bfloat16, fp8=fp8_on, scan_layers=scan_layers)
    return purax.Task(model=model, tx=purax.adamw(learning_rate=1e-2, total_steps=20),
                      loss=purax.objectives.language_model)
  tokens = RNG.integers(0, 64, (8, 17)).astype(np.int32)
  return task, {'x': tokens[:, :-1], 'y': tokens[:, 1:]}


#: A dot_general in StableHLO: its two operand element types and its result's.
DOT = re.compile(r'stablehlo\.dot_general .*?: \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\) '
                 r'-> tensor<[^>]*x(\w+)>')


def float8_dots(task, batch):
  """``Counter`` of ``'lhs x rhs -> result'`` over the dot_generals of the
  train step lowered for CUDA (on this CPU: no GPU needed) that read a
  float8 operand."""
  state = jax.eval_shape(task.init, jax.random.key(0), batch)
  text = jax.jit(task.step).trace(state, batch).lower(lowering_platforms=('cuda',)).as_text()
  dots = DOT.findall(text)
  assert dots, 'no dot_general parsed'
  return collections.Counter(f'{a} x {b} -> {c}' for a, b, c in dots
                             if a.startswith('f8') or b.startswith('f8'))


@pytest.mark.dtype_promotion('standard')   # jax's attention gradient mixes bfloat16 and float32
@pytest.mark.parametrize('num_layers, scan_layers', [(2, False), (3, True)])
def test_an_fp8_lm_step_lowers_to_one_float8_dot_forward_and_two_backward_per_matmul(
    lm_task, num_layers, scan_layers):
  task_of, batch = lm_task
  # Each block runs 4 matmuls through fp8.matmul (q/k/v, the attention's
  # output, the MLP's two); each is 1 forward dot (e4m3 x e4m3) and 2
  # backward (the input gradient e5m2 x e4m3, the weight gradient e4m3 x
  # e5m2, accumulated in float32). Unrolled layers appear once each in the
  # program; scanned ones once, in the scan's body.
  per_program = 4 * (1 if scan_layers else num_layers)
  got = float8_dots(task_of(True, num_layers, scan_layers), batch)
  assert got == {'f8E4M3FN x f8E4M3FN -> bf16': per_program,
                 'f8E5M2 x f8E4M3FN -> bf16': per_program,
                 'f8E4M3FN x f8E5M2 -> f32': per_program}, got
  # No float8 operand meets a wider one (XLA would upcast the pair), and the
  # bfloat16 model has none.
  assert not float8_dots(task_of(False, num_layers, scan_layers), batch)


@pytest.mark.dtype_promotion('standard')   # jax's attention gradient mixes bfloat16 and float32
def test_an_fp8_lm_trains_on_the_cpu_close_to_bf16(lm_task):
  task_of, batch = lm_task
  task, plain = task_of(True), task_of(False)
  # fp8 changes no parameter: the same initial state for both.
  state = jax.jit(task.init)(jax.random.key(0), batch)
  reference = purax.metrics.compute(jax.jit(plain.evaluate)(state, batch))['loss']
  step = jax.jit(task.step)
  curve = []
  for _ in range(3):
    state, metrics = step(state, batch)
    curve.append(float(purax.metrics.compute(metrics)['loss']))
  # Measured: bf16 4.1835 -> 3.7795 in 3 steps, fp8 4.1835 -> 3.7794.
  assert abs(curve[0] - reference) < 0.02, (curve, reference)
  assert curve[-1] < curve[0] - 0.3, curve
