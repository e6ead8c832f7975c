"""Sampling from a :class:`~purax.nn.transformer.DecoderLM` with a KV cache.

:func:`generate` feeds the prompt in one call (prefill, filling the cache),
then one token per step inside a ``lax.scan``; the whole loop is one jitted
program per (model, batch, prompt length, number of new tokens). Greedy when
``temperature == 0``, otherwise sampled from ``softmax(logits / temperature)``
with the explicit ``key`` (``fold_in(key, i)`` for new token ``i``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from purax.core.errors import ConfigError, DataError, expect


def init_cache(model, batch_size: int, max_len: int):
  """A zeroed KV cache for ``batch_size`` sequences of up to ``max_len`` tokens.

  Computed abstractly (``jax.eval_shape``): nothing runs but the zeros.
  Returns the ``'cache'`` collection, laid out as the model's parameters
  (:func:`purax.nn.transformer.scans`): ``cached_key`` / ``cached_value``
  ``[layers, batch, max_len, heads, head_dim]`` under ``layers`` when the
  stack is scanned, ``[batch, max_len, heads, head_dim]`` under each
  ``layers_{i}`` when unrolled; and ``index`` int32 ``[]``.
  """
  tokens = jnp.zeros((batch_size, max_len), jnp.int32)
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0), tokens, decode=True)['cache'])
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _pick(logits, key, temperature):
  """Next token ``[batch]`` from float32 logits ``[batch, vocab]``."""
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  scaled = logits / jnp.maximum(temperature, 1e-6)
  sampled = jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)
  return jnp.where(temperature > 0, sampled, greedy)


@functools.partial(jax.jit, static_argnames=('model', 'max_new_tokens'))
def _generate(model, params, prompt, key, temperature, *, max_new_tokens):
  batch, length = prompt.shape
  cache = init_cache(model, batch, length + max_new_tokens)

  def apply(cache, tokens):
    logits, variables = model.apply({'params': params, 'cache': cache}, tokens,
                                    decode=True, mutable=['cache'])
    return variables['cache'], logits[:, -1].astype(jnp.float32)

  cache, logits = apply(cache, prompt)
  first = _pick(logits, jax.random.fold_in(key, 0), temperature)

  def body(carry, i):
    cache, token = carry
    cache, logits = apply(cache, token[:, None])
    token = _pick(logits, jax.random.fold_in(key, i), temperature)
    return (cache, token), token

  _, rest = jax.lax.scan(body, (cache, first), jnp.arange(1, max_new_tokens))
  return jnp.concatenate([first[:, None], rest.T], axis=1)


def generate(model, params, prompt, *, key: jax.Array, max_new_tokens: int,
             temperature: float = 0.0) -> jax.Array:
  """Continues ``prompt`` by ``max_new_tokens`` tokens.

  Args:
    model: a :class:`~purax.nn.transformer.DecoderLM` (hashable; static).
    params: its parameters (plain arrays, e.g. ``state.params``).
    prompt: int ``[batch, prompt_len]`` token ids, ``prompt_len >= 1``.
    key: a typed PRNG key (used only when ``temperature > 0``).
    max_new_tokens: number of tokens to generate (>= 1).
    temperature: 0 for greedy decoding, > 0 to sample.

  Returns:
    int32 ``[batch, max_new_tokens]``: the new tokens only.

  Raises:
    ConfigError: ``max_new_tokens < 1``, ``temperature < 0``, or
      ``prompt_len + max_new_tokens > model.max_len`` with learned positions.
    DataError: ``prompt`` empty or not integer ``[batch, prompt_len]``.

  Example:
    >>> model = purax.nn.DecoderLM(vocab_size=256, d_model=32, num_layers=1, num_heads=2,
    ...                            max_len=32)
    >>> params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))['params']
    >>> new = purax.nn.generate(model, params, jnp.array([list(b'def ')]),
    ...                         key=jax.random.key(0), max_new_tokens=8, temperature=0.8)
    >>> new.shape, new.dtype                          # the 8 new tokens of each prompt
    ((1, 8), dtype('int32'))
  """
  prompt = jnp.asarray(prompt)
  expect(prompt.ndim == 2 and jnp.issubdtype(prompt.dtype, jnp.integer), 'prompt',
         'integer token ids [batch, prompt_len]', f'{prompt.dtype}{list(prompt.shape)}',
         DataError)
  expect(prompt.shape[1] >= 1, 'prompt', 'at least one token', 'an empty prompt', DataError)
  expect(max_new_tokens >= 1, 'max_new_tokens', '>= 1', max_new_tokens, ConfigError)
  expect(temperature >= 0, 'temperature', '>= 0 (0: greedy)', temperature, ConfigError)
  total = prompt.shape[1] + max_new_tokens
  expect(getattr(model, 'positions', 'rope') != 'learned' or total <= model.max_len,
         'prompt length + max_new_tokens', f'<= max_len ({model.max_len}) with learned '
         'positions', total, ConfigError)
  return _generate(model, params, prompt.astype(jnp.int32), key,
                   jnp.asarray(temperature, jnp.float32), max_new_tokens=int(max_new_tokens))
