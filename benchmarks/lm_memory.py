"""Temporary memory of the LM train step: full logits against the chunked loss.

For a decoder LM whose ``[batch, seq, vocab]`` logits dominate the step's
scratch memory (a large vocabulary), compiles ``jax.jit(task.step,
donate_argnums=0)`` of :class:`purax.nn.transformer.DecoderLM` with full
logits (``logits_chunk=0``, the default) and with the chunked loss
(``logits_chunk=C``: :func:`purax.core.losses.chunked_token_losses`) on
abstract inputs (nothing is allocated or run) and reads XLA's buffer
assignment, ``compiled.memory_analysis()``: ``temp`` bytes (the step's
scratch: activations kept for the backward pass, the logits and their
gradient), ``argument`` and ``output`` bytes (the state and the batch).
Also written: the bytes of one float32 copy of the logits, for scale.

Memory analysis is XLA's plan, the same on a busy machine as on an idle
one; on a GPU it is the device's (``--config gpt2``). Writes JSON (default
``benchmarks/results/lm_memory.json``); asserts nothing.

Usage::

  python benchmarks/lm_memory.py                    # 'cpu': vocab 32768, float32
  python benchmarks/lm_memory.py --config gpt2      # GPT-2 small shapes, bfloat16
  python benchmarks/lm_memory.py --config tiny --chunks 64   # a smoke run
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import purax
from purax.nn.transformer import DecoderLM
from jsonout import write_json  # noqa: E402  (beside this script)

CONFIGS = {
    'tiny': dict(vocab=2048, d=32, layers=1, heads=2, seq=64, batch=4, dtype='float32'),
    'cpu': dict(vocab=32768, d=128, layers=2, heads=4, seq=256, batch=8, dtype='float32'),
    'gpt2': dict(vocab=50304, d=768, layers=12, heads=12, seq=1024, batch=16, dtype='bfloat16'),
}


def memory(cfg: dict, chunk: int) -> dict:
  """The compiled train step's memory analysis with ``logits_chunk=chunk``."""
  model = DecoderLM(vocab_size=cfg['vocab'], d_model=cfg['d'], num_layers=cfg['layers'],
                    num_heads=cfg['heads'], max_len=cfg['seq'], positions='learned',
                    dtype=jnp.dtype(cfg['dtype']), logits_chunk=chunk)
  task = purax.Task(model=model, tx=purax.adamw(learning_rate=3e-4, total_steps=1000),
                    loss=purax.objectives.language_model)
  shape = (cfg['batch'], cfg['seq'])
  batch = {'x': jax.ShapeDtypeStruct(shape, np.int32), 'y': jax.ShapeDtypeStruct(shape, np.int32)}
  state = jax.eval_shape(task.init, jax.random.key(0), batch)
  start = time.perf_counter()
  compiled = jax.jit(task.step, donate_argnums=0).lower(state, batch).compile()
  stats = compiled.memory_analysis()
  return {'temp_bytes': int(stats.temp_size_in_bytes),
          'argument_bytes': int(stats.argument_size_in_bytes),
          'output_bytes': int(stats.output_size_in_bytes),
          'compile_s': time.perf_counter() - start}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config', default='cpu', choices=sorted(CONFIGS))
  parser.add_argument('--chunks', default='256,1024,4096',
                      help='comma-separated tokens per chunk to compare with full logits')
  parser.add_argument('--out', default='benchmarks/results/lm_memory.json')
  args = parser.parse_args()
  try:
    chunks = [int(c) for c in args.chunks.split(',') if c]
  except ValueError:
    parser.error(f'--chunks: expected comma-separated integers, got {args.chunks!r}')
  if not chunks or min(chunks) < 1:
    parser.error(f'--chunks: expected integers >= 1, got {args.chunks!r}')
  cfg = CONFIGS[args.config]
  device = jax.devices()[0]
  logits = cfg['batch'] * cfg['seq'] * cfg['vocab'] * 4
  out = {'platform': device.platform, 'device_kind': device.device_kind, 'jax': jax.__version__,
         'config': args.config, 'shape': cfg, 'logits_float32_bytes': logits, 'steps': {}}
  full = out['steps']['full'] = memory(cfg, 0)
  print(f"full logits        temp {full['temp_bytes'] / 2**20:9.1f} MiB  "
        f"(one float32 copy of the logits: {logits / 2**20:.1f} MiB)", flush=True)
  for chunk in chunks:
    m = out['steps'][str(chunk)] = memory(cfg, chunk)
    m['temp_vs_full'] = m['temp_bytes'] / max(full['temp_bytes'], 1)
    print(f"chunks of {chunk:>6} temp {m['temp_bytes'] / 2**20:9.1f} MiB  "
          f"({m['temp_vs_full']:.2f}x the full logits' step)", flush=True)
  write_json(args.out, out)


if __name__ == '__main__':
  main()
