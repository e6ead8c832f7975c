"""Sampling from a DecoderLM with a KV cache (purax.nn.generate): the cache,
laid out as the parameters, decodes as the full recomputation does (both
layouts); greedy decoding is the argmax of the full pass; sampling is a
function of the key. Equivalences compare float32 at ``highest`` matmul
precision: the same arithmetic in a different order (atol 1e-5 on O(1)
logits). Its errors: tests/nn/test_transformer.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from purax.nn.generate import generate, init_cache
from purax.nn.transformer import DecoderLM
from tests.helpers_transformer import BATCH, LM, SEQ, jit_apply, lm_params, tokens


@pytest.mark.parametrize('positions, scan_layers', [('rope', True), ('learned', True),
                                                   ('rope', False)])
def test_kv_cache_decoding_equals_full_recomputation(positions, scan_layers):
  model = DecoderLM(**LM, positions=positions, scan_layers=scan_layers)
  params = lm_params(model)
  x = tokens(3)
  apply = jit_apply(model)
  full = apply({'params': params}, x)
  cache = init_cache(model, BATCH, SEQ)
  # The cache is laid out as the parameters: stacked [layers, ...] when scanned.
  head_dim = LM['d_model'] // LM['num_heads']
  per_layer = (BATCH, SEQ, LM['num_heads'], head_dim)
  if scan_layers:
    assert cache['layers']['attention']['cached_key'].shape == (LM['num_layers'], *per_layer)
  else:
    assert 'layers' not in cache
    assert cache[f"layers_{LM['num_layers'] - 1}"]['attention']['cached_key'].shape == per_layer
  pieces = []
  for start, stop in [(0, 5)] + [(t, t + 1) for t in range(5, SEQ)]:   # prefill, then 1 by 1
    logits, variables = apply({'params': params, 'cache': cache}, x[:, start:stop],
                              decode=True, mutable=('cache',))
    cache = variables['cache']
    pieces.append(logits)
  assert int(cache['index']) == SEQ
  np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('scan_layers', [True, False])
def test_greedy_generate_equals_argmax_of_full_recomputation(scan_layers):
  model = DecoderLM(**LM, scan_layers=scan_layers)
  params = lm_params(model)
  prompt = tokens(4, (BATCH, 4))
  new = generate(model, params, prompt, key=jax.random.key(0), max_new_tokens=6)
  assert new.dtype == jnp.int32 and new.shape == (BATCH, 6)
  # Greedy: new token i is the argmax after prompt + new[:i]; by causality one
  # full pass over prompt + new gives every one of those predictions.
  logits = jit_apply(model)({'params': params}, jnp.concatenate([prompt, new], axis=1))
  np.testing.assert_array_equal(new, jnp.argmax(logits[:, 3:-1], axis=-1))


def test_sampling_is_a_function_of_the_key():
  model = DecoderLM(**LM)
  params = lm_params(model)
  prompt = tokens(4, (BATCH, 4))
  sample = lambda seed: generate(model, params, prompt, key=jax.random.key(seed),
                                 max_new_tokens=6, temperature=1.0)
  np.testing.assert_array_equal(sample(0), sample(0))
  assert not np.array_equal(sample(0), sample(1))
