"""Transformers: scan == unrolled, the scan-or-unroll rule, causality, determinism,
dtypes, logical axes, attention kernel choice, errors (the KV cache and sampling:
test_generate.py; remat: test_remat.py).

Tiny shapes (d_model 32, 2 layers, seq 16). Equivalences compare float32 at
``highest`` matmul precision: the scanned and unrolled stacks, and the cached
and full computations, are the same arithmetic in a different order, so they
agree to float32 rounding (atol 1e-5 on O(1) logits).
"""

import dataclasses
import functools
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import purax
from purax.nn.attention import (
  AttentionFallbackWarning,
  attention_implementation,
  kernels_in_hlo,
)
from purax.nn.generate import generate
from purax.nn.transformer import (
  SCAN_LAYERS_ABOVE,
  DecoderLM,
  TransformerEncoder,
  count_params,
  scans,
)
from tests.helpers_transformer import BATCH, LM, SEQ, jit_apply, lm_params, tokens

def abstract_params(model):
  """Shapes of ``model``'s parameters (not cached: a cache filled under a trace
  would hand its tracers to a later test)."""
  return jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), tokens()))['params'])


def unstack(params, num_layers):
  """Scanned params (``layers``: leading [L] axis) -> unrolled ``layers_{i}``."""
  out = {k: v for k, v in params.items() if k != 'layers'}
  for i in range(num_layers):
    out[f'layers_{i}'] = jax.tree.map(lambda a: a[i], params['layers'])
  return out


@pytest.mark.parametrize('positions', ['rope', 'learned'])
def test_scanned_decoder_equals_unrolled_stack(positions):
  scanned = DecoderLM(**LM, positions=positions, scan_layers=True)
  unrolled = scanned.clone(scan_layers=False)
  params = lm_params(scanned)
  mapped = unstack(params, LM['num_layers'])
  # The mapping is exactly the unrolled model's parameter structure and shapes.
  expected = abstract_params(unrolled)
  assert jax.tree.structure(expected) == jax.tree.structure(mapped)
  assert jax.tree.map(lambda a: a.shape, expected) == jax.tree.map(jnp.shape, mapped)
  x = tokens(1)
  with jax.default_matmul_precision('highest'):
    np.testing.assert_allclose(jit_apply(scanned)({'params': params}, x),
                               jit_apply(unrolled)({'params': mapped}, x), atol=1e-5, rtol=1e-5)


def test_scanned_encoder_equals_unrolled_stack():
  scanned = TransformerEncoder(num_classes=10, d_model=32, num_layers=2, dropout_rate=0.1,
                               scan_layers=True)
  unrolled = scanned.clone(scan_layers=False)
  x = jax.random.normal(jax.random.key(0), (BATCH, 8, 8, 1))
  params = nn.unbox(jax.jit(scanned.init)(jax.random.key(0), x))['params']
  with jax.default_matmul_precision('highest'):
    np.testing.assert_allclose(jit_apply(scanned)({'params': params}, x),
                               jit_apply(unrolled)({'params': unstack(params, 2)}, x),
                               atol=1e-5, rtol=1e-5)


def test_scan_traces_one_layer_whatever_the_depth():
  """The program XLA compiles does not grow with depth (compile time flat in L)."""
  def num_equations(layers):
    model = DecoderLM(**{**LM, 'num_layers': layers, 'scan_layers': True})
    params = abstract_params(model)
    return len(jax.make_jaxpr(lambda p: model.apply({'params': p}, tokens()))(params).eqns)
  assert num_equations(2) == num_equations(12)


def _layer_keys(model, x):
  """The top-level parameter names of ``model``'s stack (abstract init)."""
  params = jax.eval_shape(model.init, jax.random.key(0), x)['params']
  return sorted(k for k in params if k.startswith('layers'))


@pytest.mark.parametrize('scan_layers', [None, True, False])
@pytest.mark.parametrize('depth', [2, SCAN_LAYERS_ABOVE, SCAN_LAYERS_ABOVE + 1])
def test_shallow_stacks_are_unrolled_and_deep_ones_scanned_unless_asked(depth, scan_layers):
  """Unset: unrolled up to SCAN_LAYERS_ABOVE layers (faster, lighter when shallow),
  scanned above (compile time flat in depth); True / False as asked. The
  parameter tree shows it: ``layers`` with a leading [depth] axis, or ``layers_{i}``."""
  scanned = depth > SCAN_LAYERS_ABOVE if scan_layers is None else scan_layers
  assert scans(depth, scan_layers) == scanned
  unrolled_keys = sorted(f'layers_{i}' for i in range(depth))
  small = dict(d_model=8, num_layers=depth, num_heads=2, scan_layers=scan_layers)
  lm = DecoderLM(vocab_size=16, max_len=4, **small)
  encoder = TransformerEncoder(num_classes=3, **small)
  for model, x in [(lm, jnp.zeros((1, 4), jnp.int32)), (encoder, jnp.zeros((1, 4, 3)))]:
    assert _layer_keys(model, x) == (['layers'] if scanned else unrolled_keys)
  if scanned:
    params = jax.eval_shape(lm.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    assert nn.unbox(params)['params']['layers']['mlp']['wi'].shape == (depth, 8, 32)


@functools.lru_cache(maxsize=None)
def causal_apply():
  model = DecoderLM(**LM)
  params = lm_params(model)
  return jax.jit(lambda x: model.apply({'params': params}, x))


@settings(max_examples=8)
@given(t=st.integers(0, SEQ - 2), seed=st.integers(0, 2**16))
def test_output_at_t_does_not_depend_on_later_tokens(t, seed):
  x = tokens(seed, (1, SEQ))
  later = jax.random.randint(jax.random.key(seed + 1), (1, SEQ - t - 1), 0, 256, jnp.int32)
  y = x.at[:, t + 1:].set(later)
  assume_changed = bool((x != y).any())
  a, b = causal_apply()(x), causal_apply()(y)
  np.testing.assert_array_equal(a[:, :t + 1], b[:, :t + 1])
  if assume_changed:   # and the later tokens do matter downstream
    assert not np.allclose(a[:, t + 1:], b[:, t + 1:])


def test_encoder_is_deterministic_in_evaluation_and_not_in_training():
  model = TransformerEncoder(num_classes=10, d_model=32, num_layers=2, dropout_rate=0.5)
  x = jax.random.normal(jax.random.key(0), (BATCH, 8, 8, 1))
  variables = jax.jit(model.init)(jax.random.key(0), x)
  apply = jit_apply(model)
  run = lambda train, seed: apply(variables, x, train=train,
                                  rngs={'dropout': jax.random.key(seed)})
  np.testing.assert_array_equal(run(False, 0), run(False, 1))
  assert not np.allclose(run(True, 0), run(True, 1))


def test_compute_dtype_and_storage_dtype_are_separate():
  model = DecoderLM(**LM, dtype=jnp.bfloat16)
  variables = jax.eval_shape(model.init, jax.random.key(0), tokens())
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nn.unbox(variables)))
  logits = jax.eval_shape(lambda v: model.apply(v, tokens()), variables)
  assert logits.dtype == jnp.bfloat16 and logits.shape == (BATCH, SEQ, 256)
  out = jax.eval_shape(
      lambda: TransformerEncoder(num_classes=3, d_model=32, dtype=jnp.bfloat16).init_with_output(
          jax.random.key(0), jnp.ones((2, 8, 8)))[0])
  assert out.dtype == jnp.bfloat16 and out.shape == (2, 3)


def test_parameters_carry_logical_axis_names():
  variables = jax.eval_shape(DecoderLM(**LM, scan_layers=True).init, jax.random.key(0), tokens())
  specs = nn.get_partition_spec(variables)['params']
  assert specs['embed']['embedding'] == jax.sharding.PartitionSpec('vocab', 'embed')
  assert specs['layers']['mlp']['wi'] == jax.sharding.PartitionSpec('layers', 'embed', 'mlp')
  assert specs['layers']['attention']['qkv'][:4] == ('layers', 'embed', None, 'heads')
  # Unrolled: the same names per layer, without the 'layers' axis.
  variables = jax.eval_shape(DecoderLM(**LM, scan_layers=False).init, jax.random.key(0),
                             tokens())
  specs = nn.get_partition_spec(variables)['params']
  assert specs['layers_1']['mlp']['wi'] == jax.sharding.PartitionSpec('embed', 'mlp')
  assert specs['layers_1']['attention']['qkv'][:3] == ('embed', None, 'heads')


def test_attention_kernel_is_chosen_for_the_device():
  assert attention_implementation(jnp.bfloat16, 64, backend='gpu') == 'cudnn'
  assert attention_implementation(jnp.float16, 128, backend='gpu') == 'cudnn'
  assert attention_implementation(jnp.float32, 64, backend='gpu') == 'xla'
  assert attention_implementation(jnp.bfloat16, 160, backend='gpu') == 'xla'
  assert attention_implementation(jnp.bfloat16, 64, backend='cpu') == 'xla'
  assert attention_implementation(jnp.bfloat16, 64, backend='tpu') == 'xla'


def test_parameter_count_is_gpt2_small_at_gpt2_small_shapes():
  model = DecoderLM(vocab_size=50257, d_model=768, num_layers=12, num_heads=12,
                    max_len=1024, positions='learned')
  params = jax.eval_shape(lambda: lm_params(model, jnp.zeros((1, 8), jnp.int32)))
  d, layers = 768, 12
  assert count_params(params) == 50257 * d + layers * (12 * d * d + 13 * d) + 2 * d
  assert count_params(params, exclude=()) == count_params(params) + 1024 * d   # 124.4M


def test_bad_configurations_and_inputs_name_the_field():
  with pytest.raises(purax.ConfigError, match='d_model: expected a multiple of num_heads'):
    DecoderLM(d_model=30, num_heads=4).init(jax.random.key(0), tokens())
  with pytest.raises(purax.ConfigError, match='remat: expected one of'):
    DecoderLM(**LM, remat='some').init(jax.random.key(0), tokens())
  with pytest.raises(purax.DataError, match=r'tokens: expected integer \[batch, seq\]'):
    DecoderLM(**LM).init(jax.random.key(0), jnp.zeros((2, 4)))
  with pytest.raises(purax.DataError, match=r'seq\): expected <= max_len \(16\)'):
    DecoderLM(**LM, positions='learned').init(jax.random.key(0), tokens(0, (1, 17)))
  model = DecoderLM(**LM, positions='learned')
  params = lm_params(model)
  with pytest.raises(purax.DataError, match='prompt: expected at least one token'):
    generate(model, params, jnp.zeros((1, 0), jnp.int32), key=jax.random.key(0),
             max_new_tokens=2)
  with pytest.raises(purax.ConfigError, match=r'max_new_tokens: expected <= max_len \(16\)'):
    generate(model, params, tokens(0, (1, 8)), key=jax.random.key(0), max_new_tokens=9)
  with pytest.raises(purax.ConfigError, match='temperature: expected >= 0'):
    generate(model, params, tokens(0, (1, 8)), key=jax.random.key(0), max_new_tokens=1,
             temperature=-1.0)


@pytest.mark.dtype_promotion('standard')   # jax's attention gradient mixes bfloat16 and float32
def test_an_unavailable_cudnn_kernel_falls_back_to_xla_only_when_chosen_automatically():
  from purax.nn.attention import attend
  q = jax.random.normal(jax.random.key(0), (1, 8, 2, 16), jnp.bfloat16)
  if jax.default_backend() == 'gpu':
    pytest.skip('cuDNN is available here')
  with pytest.warns(AttentionFallbackWarning, match=r'cuDNN attention is unavailable .*bfloat16'):
    out = attend(q, q, q, causal=True, implementation='cudnn')
  np.testing.assert_array_equal(
      out, jax.nn.dot_product_attention(q, q, q, is_causal=True, implementation='xla'))
  with pytest.raises(RuntimeError):
    attend(q, q, q, causal=True, implementation='cudnn', fallback=False)


@pytest.fixture
def pretend_cudnn(monkeypatch):
  """Lets jax lower cuDNN attention for CUDA on a machine without a GPU.

  jax asks the CUDA plugin for the cuDNN version and the GPU's compute
  capability while tracing; the answers of an H100/H200 with cuDNN 9.10 are
  given instead, and purax's kernel choice sees a GPU backend. Only lowering
  (StableHLO for ``cuda``) is possible here, not compiling or running.
  """
  from jax._src.cudnn import fused_attention_stablehlo as cudnn

  from purax.nn import attention
  monkeypatch.setattr(cudnn, 'check_cudnn_version', lambda: 91000)
  monkeypatch.setattr(cudnn, 'check_compute_capability', lambda capability: True)
  monkeypatch.setattr(cudnn, 'is_cuda_compute_capability_equal', lambda capability: False)
  choose = attention.attention_implementation
  monkeypatch.setattr(attention, 'attention_implementation',
                      lambda dtype, head_dim, **kw: choose(dtype, head_dim, backend='gpu', **kw))


@pytest.mark.dtype_promotion('standard')   # jax's attention gradient mixes bfloat16 and float32
@pytest.mark.parametrize('remat, scan_layers', [('none', True), ('full', True), ('none', None)])
def test_default_bf16_lm_step_lowers_to_cudnn_attention_on_a_gpu(pretend_cudnn, remat,
                                                                   scan_layers):
  # The configuration a user gets (no implementation named) in bfloat16, layers
  # scanned (as deep models are) or by default (unrolled at 2 layers): forward
  # and backward attention both become cuDNN's fused kernel.
  model = DecoderLM(vocab_size=256, d_model=64, num_layers=2, num_heads=2, max_len=32,
                    dtype=jnp.bfloat16, remat=remat, scan_layers=scan_layers)
  task = purax.Task(model=model, tx=purax.adamw(learning_rate=1e-3, total_steps=10),
                    loss=purax.objectives.language_model)
  batch = {'x': jnp.zeros((2, 32), jnp.int32), 'y': jnp.zeros((2, 32), jnp.int32)}
  state = jax.eval_shape(task.init, jax.random.key(0), batch)
  with warnings.catch_warnings():
    warnings.simplefilter('error', AttentionFallbackWarning)
    lowered = jax.jit(task.step).trace(state, batch).lower(lowering_platforms=('cuda',))
  assert kernels_in_hlo(lowered.as_text()) == ['__cudnn$fmhaSoftmax',
                                               '__cudnn$fmhaSoftmaxBackward']
  # float32 compute has no cuDNN kernel: XLA's, chosen (not fallen back to).
  task32 = dataclasses.replace(task, model=model.clone(dtype=jnp.float32))
  with warnings.catch_warnings():
    warnings.simplefilter('error', AttentionFallbackWarning)
    lowered = jax.jit(task32.step).trace(state, batch).lower(lowering_platforms=('cuda',))
  assert kernels_in_hlo(lowered.as_text()) == []
  # An odd sequence length: cuDNN's backward pass refuses it (jax says so only
  # when differentiating, past any fallback), so XLA's kernel is chosen up front.
  odd = {k: v[:, :31] for k, v in batch.items()}
  with warnings.catch_warnings():
    warnings.simplefilter('error', AttentionFallbackWarning)
    lowered = jax.jit(task.step).trace(state, odd).lower(lowering_platforms=('cuda',))
  assert kernels_in_hlo(lowered.as_text()) == []


def test_float16_attention_runs_on_the_cpu():
  # XLA's CPU dot has no float16 x float16 -> float32 form: attention is
  # computed in float32 there, the model stays float16 (and decoding works).
  model = DecoderLM(vocab_size=256, d_model=32, num_layers=2, num_heads=4, max_len=16,
                    dtype=jnp.float16)
  task = purax.Task(model=model, tx=purax.adamw(learning_rate=1e-3, total_steps=10),
                    loss=purax.objectives.language_model)
  batch = {'x': tokens(0, (2, 16)), 'y': tokens(1, (2, 16))}
  state, metrics = jax.jit(task.step)(jax.jit(task.init)(jax.random.key(0), batch), batch)
  assert np.isfinite(float(metrics['loss'].compute()))
  assert jax.jit(task.predict)(state, batch['x']).dtype == jnp.float16
  out = generate(model, state.params, batch['x'][:, :4], key=jax.random.key(0),
                 max_new_tokens=3, temperature=0.0)
  assert out.shape == (2, 3)                     # the new tokens


def test_what_a_gpu_user_gets_without_flags(pretend_cudnn, monkeypatch):
  # `purax train --model lm` with no precision, layout or kernel named, its
  # platform faked as a GPU: bf16 compute on float32 params (recorded as
  # 'bf16'), the layers unrolled at this depth, cuDNN attention (the guard's
  # select form: tests/core/test_update.py).
  from purax.app import models
  from purax.app.config import TrainConfig
  from purax.core import precision
  monkeypatch.setattr(precision, 'platform', lambda: 'gpu')
  config = TrainConfig.of(model='lm', workdir='w', num_layers=2, d_model=64).resolved()
  assert (config.model.precision, config.model.scan_layers) == ('bf16', False)
  model = models.build(config.model, num_classes=256, seq_len=32)
  assert (model.dtype, model.param_dtype) == (jnp.bfloat16, jnp.float32)
  task = purax.Task(model=model, tx=purax.adamw(learning_rate=1e-3, total_steps=10),
                    loss=purax.objectives.language_model)
  batch = {'x': jnp.zeros((2, 32), jnp.int32), 'y': jnp.zeros((2, 32), jnp.int32)}
  state = jax.eval_shape(task.init, jax.random.key(0), batch)
  text = jax.jit(task.step).trace(state, batch).lower(lowering_platforms=('cuda',)).as_text()
  assert kernels_in_hlo(text) == ['__cudnn$fmhaSoftmax', '__cudnn$fmhaSoftmaxBackward']
