"""Language-model training speed: purax vs a hand-written flax+optax GPT, side by side.

One run measures, for each shape, the same decoder-only model (pre-LN GPT,
learned positions, tied embeddings, GELU MLP, biases; vocabulary padded to a
multiple of 64 as in nanoGPT) trained with AdamW + global-norm clipping on a
fixed random batch (compute only, no input pipeline):

- ``purax``: ``purax.Task(DecoderLM(...), purax.adamw(...),
  loss=purax.objectives.language_model)`` with its defaults (layers unrolled up
  to ``purax.nn.transformer.SCAN_LAYERS_ABOVE`` = 24 and scanned deeper: the
  ``cpu`` config's 4, ``gpt2``'s 12 and ``1.3b``'s 24 unrolled;
  attention kernel chosen for the device, float32 per-token loss, non-finite
  guard), ``jax.jit(task.step, donate_argnums=0)``.
- ``flax_xla``: the straightforward hand-written version (``nn.Dense`` layers
  in a Python loop, ``jax.nn.dot_product_attention`` with its default XLA
  kernel, ``optax.adamw``), jitted with donation.
- ``flax_cudnn`` (GPU only): the same code with ``implementation='cudnn'``.
- ``purax_fp8``: purax with the blocks' matmuls in float8 (``DecoderLM(fp8=True)``,
  :mod:`purax.nn.fp8`; the ``fp8`` precision preset), bfloat16 elsewhere.
- diagnostics: ``purax_chunked`` (the chunked loss, ``logits_chunk=4096``:
  what not holding the logits costs in time and saves in memory),
  ``purax_scanned`` (``scan_layers=True``), ``purax_unrolled``
  (``scan_layers=False``), ``purax_remat`` (``remat='dots_saveable'``),
  ``purax_noguard`` (``Task(skip_nonfinite=False)``: what the non-finite guard
  costs), ``purax_plain_loss`` (the hand-written loop's loss, optax's
  cross-entropy, through ``Task(loss=...)``: what the built-in LM loss's
  accuracy, bits-per-byte and smoothing term cost).

For each: compile time (trace + lower + compile), temporary memory of the
compiled step (``memory_analysis().temp_size_in_bytes``), step time (median
of ``--trials`` timings of ``--steps`` steps after warm-up; off GPU the trials
of a config's variants alternate, ``--interleave``, so load from other jobs
hits all alike), tokens/s and MFU
(:mod:`purax.inspect.flops`: 6N + 12·L·d·T per token, dense bf16 peak of the
device; None on CPU). Then the compile time of the purax step at 4 and 48
layers (abstract inputs, nothing allocated; its defaults: 4 layers unrolled, 48
scanned), and of the hand-written one.

Shapes (``--config auto`` picks by platform): on GPU ``gpt2`` (124M: d 768,
12 layers, 12 heads, seq 1024, batch 16) and ``1.3b`` (d 2048, 24 layers, 16
heads, seq 2048, batch 8), bfloat16 compute, float32 params; on CPU ``cpu``
(d 128, 4 layers, 4 heads, seq 128, batch 16, vocab 256, float32).

``attention_kernel`` records the kernel the compiled step really calls (cuDNN's
fused-attention custom calls found in its HLO, or XLA's), not the one asked for;
``hlo_ops`` counts the compiled program's instructions by opcode (fusions,
custom calls, conditionals, copies, ...: what XLA made of the step on this
device; ``benchmarks/hlo_diff.py`` compares the programs before XLA);
``float8_gemms`` counts its cuBLASLt float8 GEMMs (``__cublas$lt$matmul$f8``
custom calls: ``purax_fp8``'s float8 dots kept as float8 on the GPU).

``--config tiny`` (bfloat16, 2 layers, vocab 512) is the smoke form of the
GPU measurement that ``benchmarks/gpu.sh`` runs with ``GPU_SMOKE=1`` on any
machine.

Usage (on a GPU machine ``sh benchmarks/gpu.sh`` runs this and the other GPU
measurements within one timed call)::

  python benchmarks/lm.py --budget-s 330 --out benchmarks/results/lm_gpu.json
  python benchmarks/lm.py --config cpu --out benchmarks/results/lm_cpu.json

Nothing is asserted. Measurements run most-needed first (purax and the cuDNN
baseline at each shape, purax's compile-by-depth, then the XLA baseline and
the rest); results are written after every one, so a timeout or the budget
still leaves the finished ones.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import purax
from purax.inspect import flops
from purax.nn.attention import attention_implementation, kernels_in_hlo
from purax.nn.transformer import DecoderLM, count_params
from jsonout import write_json  # noqa: E402  (beside this script)

CONFIGS = {
    'tiny': dict(vocab=512, d=64, layers=2, heads=2, seq=64, batch=4, dtype='bfloat16'),
    'cpu': dict(vocab=256, d=128, layers=4, heads=4, seq=128, batch=16, dtype='float32'),
    'gpt2': dict(vocab=50304, d=768, layers=12, heads=12, seq=1024, batch=16, dtype='bfloat16'),
    '1.3b': dict(vocab=50304, d=2048, layers=24, heads=16, seq=2048, batch=8, dtype='bfloat16'),
}
LR = 3e-4


# -- the hand-written baseline ---------------------------------------------------

class Block(nn.Module):
  d: int
  heads: int
  dtype: jnp.dtype
  implementation: str | None

  @nn.compact
  def __call__(self, x):
    b, s, _ = x.shape
    h = nn.LayerNorm(dtype=self.dtype)(x)
    qkv = nn.Dense(3 * self.d, dtype=self.dtype)(h).reshape(b, s, 3, self.heads, -1)
    a = jax.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2],
                                     is_causal=True, implementation=self.implementation)
    x = x + nn.Dense(self.d, dtype=self.dtype)(a.reshape(b, s, self.d))
    h = nn.LayerNorm(dtype=self.dtype)(x)
    h = nn.Dense(self.d, dtype=self.dtype)(nn.gelu(nn.Dense(4 * self.d, dtype=self.dtype)(h)))
    return x + h


class GPT(nn.Module):
  vocab: int
  d: int
  layers: int
  heads: int
  seq: int
  dtype: jnp.dtype
  implementation: str | None = None

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(self.vocab, self.d, dtype=self.dtype,
                     embedding_init=nn.initializers.normal(0.02))
    pos = self.param('pos', nn.initializers.normal(0.01), (self.seq, self.d))
    x = embed(tokens) + pos.astype(self.dtype)[None]
    for _ in range(self.layers):
      x = Block(self.d, self.heads, self.dtype, self.implementation)(x)
    return embed.attend(nn.LayerNorm(dtype=self.dtype)(x))


def handwritten(cfg, dtype, implementation):
  model = GPT(cfg['vocab'], cfg['d'], cfg['layers'], cfg['heads'], cfg['seq'], dtype,
              implementation)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(LR, weight_decay=0.1))

  def loss_fn(params, batch):
    logits = model.apply({'params': params}, batch['x'])
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), batch['y']).mean()

  def step(state, batch):
    params, opt_state = state
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  def init(batch):
    params = model.init(jax.random.key(0), batch['x'])['params']
    return params, tx.init(params)

  return init, step, lambda state: state[0]


def plain_loss(logits, batch, hparams):
  """The hand-written loop's loss through purax's loss contract: optax's
  cross-entropy on float32 logits, no accuracy, no smoothing term."""
  del hparams
  return optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), batch['y']), None, {}


def purax_task(cfg, dtype, *, loss=purax.objectives.language_model, skip_nonfinite=True,
               **model_kwargs):
  model = DecoderLM(vocab_size=cfg['vocab'], d_model=cfg['d'], num_layers=cfg['layers'],
                    num_heads=cfg['heads'], max_len=cfg['seq'], positions='learned',
                    dtype=dtype, **model_kwargs)
  task = purax.Task(model=model, tx=purax.adamw(learning_rate=LR, total_steps=10_000,
                                                weight_decay=0.1),
                    loss=loss, skip_nonfinite=skip_nonfinite)
  return (lambda batch: task.init(jax.random.key(0), batch), task.step,
          lambda state: state.params)


# -- measurement ----------------------------------------------------------------

def make_batch(cfg):
  tokens = np.random.default_rng(0).integers(0, cfg['vocab'], (cfg['batch'], cfg['seq'] + 1))
  return {'x': jnp.asarray(tokens[:, :-1], jnp.int32), 'y': jnp.asarray(tokens[:, 1:], jnp.int32)}


class Run:
  """One variant's compiled step and live state: compiled and warmed up on
  construction, timed a trial at a time (so trials of several variants can
  alternate), summarised by :meth:`result`."""

  def __init__(self, build, cfg):
    init, step, params_of = build
    self.cfg, self.batch = cfg, make_batch(cfg)
    self.state = jax.jit(init)(self.batch)
    self.n_params = count_params(params_of(self.state), exclude=('pos_embedding', 'pos'))
    jitted = jax.jit(step, donate_argnums=0)
    start = time.perf_counter()
    self.compiled = jitted.lower(self.state, self.batch).compile()
    self.compile_s = time.perf_counter() - start
    self.memory = self.compiled.memory_analysis()
    text = self.compiled.as_text()
    self.cudnn_calls = kernels_in_hlo(text)
    self.hlo_ops = hlo_ops(text)
    # purax_fp8's float8 dots as XLA:GPU runs them: cuBLASLt float8 GEMMs
    # (compute capability 8.9+), else upcast to wider dots (0 here).
    self.float8_gemms = text.count('custom_call_target="__cublas$lt$matmul$f8"')
    for _ in range(2):   # warm-up
      self.state, out = self.compiled(self.state, self.batch)
    jax.block_until_ready(self.state)
    self.times = []

  def trial(self, steps):
    start = time.perf_counter()
    for _ in range(steps):
      self.state, out = self.compiled(self.state, self.batch)
    jax.block_until_ready((self.state, out))
    self.times.append((time.perf_counter() - start) / steps)

  def result(self):
    cfg = self.cfg
    step_s = statistics.median(self.times)
    tokens_per_sec = cfg['batch'] * cfg['seq'] / step_s
    per_token = flops.flops_per_token(self.n_params, num_layers=cfg['layers'],
                                      d_model=cfg['d'], seq_len=cfg['seq'])
    device = jax.devices()[0]
    mfu = flops.mfu(tokens_per_sec, per_token, device_kind=device.device_kind,
                    dtype=jnp.dtype(cfg['dtype']))
    memory = self.memory
    return {
        'step_time_s': step_s, 'step_times_s': self.times, 'tokens_per_sec': tokens_per_sec,
        'mfu': mfu, 'compile_s': self.compile_s,
        'temp_bytes': getattr(memory, 'temp_size_in_bytes', None),
        'argument_bytes': getattr(memory, 'argument_size_in_bytes', None),
        'params': self.n_params, 'flops_per_token': per_token,
        # what the compiled step really calls, not what was asked for
        'attention_kernel': 'cudnn' if self.cudnn_calls else 'xla',
        'cudnn_calls': self.cudnn_calls,
        'hlo_ops': self.hlo_ops,
        'float8_gemms': self.float8_gemms,
    }

  def close(self):
    del self.state, self.compiled
    gc.collect()


#: Opcodes of compiled HLO counted by :func:`hlo_ops` (the rest are summed as 'other').
HLO_OPS = ('fusion', 'custom-call', 'conditional', 'while', 'copy', 'transpose', 'convert',
           'all-reduce', 'all-gather', 'reduce-scatter', 'copy-start', 'send', 'recv')


def hlo_ops(text: str) -> dict:
  """Instructions of a compiled module's text by opcode (those of :data:`HLO_OPS`;
  ``'instructions'``: all), over every computation (a fusion's body included)."""
  found = re.findall(r'^\s*(?:ROOT )?%\S+ = (?:\([^=]*?\)|\S+) ([a-z][\w-]*)\(', text, re.M)
  counts = {op: found.count(op) for op in HLO_OPS if op in found}
  counts['instructions'] = len(found)
  return counts


def measure(build, cfg, *, steps, trials):
  """All trials of one variant, then its memory freed (the GPU order)."""
  run = Run(build, cfg)
  for _ in range(trials):
    run.trial(steps)
  result = run.result()
  run.close()
  return result


def measure_interleaved(builds: dict, cfg, *, steps, trials) -> dict:
  """Every variant compiled and warmed up, then trials round-robin (variant
  A, B, C, A, B, C, ...), so load and drift on a shared machine hit all
  alike: the CPU order. A variant that fails is recorded with its error."""
  runs, results = {}, {}
  for name, build in builds.items():
    try:
      runs[name] = Run(build, cfg)
    except Exception as e:   # e.g. out of memory: record it, keep going
      results[name] = {'error': f'{type(e).__name__}: {str(e)[:500]}'}
  for _ in range(trials):
    for run in runs.values():
      run.trial(steps)
  for name, run in runs.items():
    results[name] = run.result()
    run.close()
  return results


def compile_seconds(build, cfg):
  """Trace + lower + compile of the train step on abstract inputs."""
  init, step, _ = build
  batch = jax.eval_shape(lambda: make_batch(cfg))
  state = jax.eval_shape(init, batch)
  start = time.perf_counter()
  jax.jit(step, donate_argnums=0).lower(state, batch).compile()
  return time.perf_counter() - start


def plan(names, chosen, depth_variants):
  """The measurements in the order they run: purax and the strongest baseline
  first, so that a run cut short by ``--budget-s`` (or a device lease) still
  has the comparison that matters."""
  order = ['purax', 'flax_cudnn', 'purax_fp8', 'flax_xla', 'purax_noguard', 'purax_plain_loss',
           'purax_chunked', 'purax_scanned', 'purax_unrolled', 'purax_remat']
  first = [v for v in order[:2] if v in chosen]
  second = [v for v in order[2:3] if v in chosen]
  rest = [v for v in order[3:] if v in chosen]
  items = [('step', n, v) for n in names for v in first]
  items += [('step', n, v) for n in names for v in second]
  items += [('depth', None, v) for v in depth_variants if v == 'purax']
  items += [('step', n, v) for n in names for v in rest]
  items += [('depth', None, v) for v in depth_variants if v != 'purax']
  return items


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config', default='auto',
                      help="'auto' (gpt2,1.3b on GPU; cpu elsewhere) or names from "
                           f'{sorted(CONFIGS)}, comma-separated')
  parser.add_argument('--steps', type=int, default=None, help='timed steps per trial')
  parser.add_argument('--trials', type=int, default=3)
  parser.add_argument('--depths', default='4,48', help='layer counts for compile time')
  parser.add_argument('--no-depth', action='store_true', help='skip the compile-time sweep')
  parser.add_argument('--variants', default=None,
                      help='comma-separated among purax, flax_xla, flax_cudnn (GPU), purax_fp8, '
                           'and the diagnostic purax_chunked, purax_scanned, purax_unrolled, '
                           'purax_remat, purax_noguard, purax_plain_loss (default: purax, '
                           'flax_xla and on a GPU flax_cudnn)')
  parser.add_argument('--budget-s', type=float, default=None,
                      help='start no new measurement after this many seconds (they are '
                           'recorded as skipped); for a timed device lease')
  parser.add_argument('--interleave', default='auto', choices=['auto', 'yes', 'no'],
                      help="alternate the trials of a config's variants (all compiled and "
                           "alive at once) instead of running each variant's trials in turn; "
                           "'auto': yes except on GPU (where memory and the budget order "
                           'matter more than load from other jobs)')
  parser.add_argument('--out', default=None)
  args = parser.parse_args()
  began = time.perf_counter()
  device = jax.devices()[0]
  gpu = device.platform == 'gpu'
  interleave = args.interleave == 'yes' or (args.interleave == 'auto' and not gpu)
  names = (['gpt2', '1.3b'] if gpu else ['cpu']) if args.config == 'auto' \
      else args.config.split(',')
  if sorted(set(names) - set(CONFIGS)):
    parser.error(f'--config: expected names from {sorted(CONFIGS)}, got {names}')
  steps = args.steps or (10 if gpu else 5)
  out = args.out or f"benchmarks/results/lm_{'gpu' if gpu else 'cpu'}.json"
  results = {'platform': device.platform, 'device_kind': device.device_kind,
             'device_count': jax.device_count(), 'cpu_count': os.cpu_count(),
             'python': platform.python_version(), 'jax': jax.__version__,
             'flax': __import__('flax').__version__, 'optax': optax.__version__,
             'peak_flops': flops.peak_flops(device.device_kind, jnp.bfloat16),
             'steps': steps, 'trials': args.trials, 'interleaved': interleave,
             'configs': {}, 'compile_by_depth': {},
             'skipped': []}

  def save():   # atomically: a run killed by its time limit keeps the last good file
    write_json(out, results, say=False)

  builders = {'purax': lambda c, d: purax_task(c, d),
              'flax_xla': lambda c, d: handwritten(c, d, None),
              'flax_cudnn': lambda c, d: handwritten(c, d, 'cudnn'),
              'purax_scanned': lambda c, d: purax_task(c, d, scan_layers=True),
              'purax_unrolled': lambda c, d: purax_task(c, d, scan_layers=False),
              'purax_remat': lambda c, d: purax_task(c, d, remat='dots_saveable'),
              'purax_noguard': lambda c, d: purax_task(c, d, skip_nonfinite=False),
              'purax_plain_loss': lambda c, d: purax_task(c, d, loss=plain_loss),
              'purax_fp8': lambda c, d: purax_task(c, d, fp8=True),
              'purax_chunked': lambda c, d: purax_task(c, d, logits_chunk=4096)}
  chosen = (args.variants.split(',') if args.variants
            else ['purax', 'flax_xla'] + (['flax_cudnn'] if gpu else []))
  unknown = sorted(set(chosen) - set(builders))
  if unknown:
    parser.error(f'--variants: expected names from {sorted(builders)}, got {unknown}')
  depth_variants = [] if args.no_depth else [v for v in ('purax', 'flax_xla') if v in chosen]
  base = CONFIGS['gpt2' if gpu else 'cpu']
  depth_cfg = dict(base, batch=base['batch'] if gpu else 4, seq=base['seq'] if gpu else 64)
  for kind, name, variant in plan(names, chosen, depth_variants):
    label = f'{name} {variant}' if kind == 'step' else f'compile-by-depth {variant}'
    if args.budget_s is not None and time.perf_counter() - began > args.budget_s:
      results['skipped'].append(label)
      print('skipped (budget):', label, flush=True)
      save()
      continue
    if kind == 'step':
      cfg = CONFIGS[name]
      dtype = jnp.dtype(cfg['dtype'])
      entry = results['configs'].setdefault(name, {'shape': cfg})
      entry['purax_attention_choice'] = attention_implementation(
          dtype, cfg['d'] // cfg['heads'], seq_len=cfg['seq'])
      if interleave:
        if variant in entry:    # measured with the config's first variant
          continue
        names_here = [v for k, n, v in plan(names, chosen, []) if n == name]
        entry.update(measure_interleaved({v: builders[v](cfg, dtype) for v in names_here},
                                         cfg, steps=steps, trials=args.trials))
        for v in names_here:
          print(name, v, json.dumps(entry[v]), flush=True)
      else:
        try:
          entry[variant] = measure(builders[variant](cfg, dtype), cfg, steps=steps,
                                   trials=args.trials)
        except Exception as e:   # e.g. out of memory: record it, keep going
          entry[variant] = {'error': f'{type(e).__name__}: {str(e)[:500]}'}
        print(name, variant, json.dumps(entry[variant]), flush=True)
    else:
      row = results['compile_by_depth'].setdefault(variant, {'shape': depth_cfg})
      try:
        for depth in map(int, args.depths.split(',')):
          c = dict(depth_cfg, layers=depth)
          row[str(depth)] = compile_seconds(builders[variant](c, jnp.dtype(c['dtype'])), c)
          print(variant, depth, 'layers: compile', f'{row[str(depth)]:.1f}s', flush=True)
          save()
        depths = [k for k in row if k.isdigit()]
        row['ratio_last_to_first'] = row[depths[-1]] / row[depths[0]]
      except Exception as e:   # record it, keep going
        row['error'] = f'{type(e).__name__}: {str(e)[:500]}'
        print(variant, 'compile by depth', row['error'], flush=True)
    save()
  print(summary(results))
  print(f'wrote {out}')


def summary(results) -> str:
  """A short table of the step measurements (the end of a device call's output)."""
  lines = [f"{results['device_kind']} jax {results['jax']}",
           f"{'config':6} {'variant':16} {'step ms':>8} {'tok/s':>9} {'MFU':>6} "
           f"{'temp GiB':>8} {'compile s':>9} {'conds':>5} kernel"]
  for name, entry in results['configs'].items():
    for variant, m in entry.items():
      if not isinstance(m, dict) or variant == 'shape':
        continue
      if 'error' in m:
        lines.append(f'{name:6} {variant:16} {m["error"][:60]}')
        continue
      mfu = '-' if m['mfu'] is None else f"{100 * m['mfu']:.1f}%"
      temp = '-' if m['temp_bytes'] is None else f"{m['temp_bytes'] / 2**30:.2f}"
      conds = m.get('hlo_ops', {}).get('conditional', 0)
      lines.append(f"{name:6} {variant:16} {1e3 * m['step_time_s']:8.1f} "
                   f"{m['tokens_per_sec']:9.0f} {mfu:>6} {temp:>8} {m['compile_s']:9.1f} "
                   f"{conds:>5} {m['attention_kernel']}")
  for variant, row in results['compile_by_depth'].items():
    if 'ratio_last_to_first' in row:
      lines.append(f"compile {variant}: " + ', '.join(
          f'{k} layers {v:.1f}s' for k, v in row.items() if k.isdigit())
          + f", ratio {row['ratio_last_to_first']:.2f}x")
  if results['skipped']:
    lines.append('skipped: ' + '; '.join(results['skipped']))
  return '\n'.join(lines)


if __name__ == '__main__':
  main()
