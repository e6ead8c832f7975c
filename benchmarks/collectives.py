"""The collectives in the compiled step, per strategy, against the analytic minimum.

For data parallel, FSDP, tensor parallel (jit + NamedSharding) and the
shard_map data-parallel step, compiles one training step of an MLP on 8 CPU
host devices, reads every collective from the compiled (SPMD-partitioned)
HLO — kind, count, bytes — and compares the total bytes with the minimum a
perfect implementation needs:

- data parallel: one all-reduce of the gradients (P bytes);
- FSDP: the ZeRO-3 schedule, an all-gather of each split parameter (forward)
  and a reduce-scatter of its gradient, plus an all-reduce of the replicated
  small arrays' gradients (2 P_split + P_replicated). This is the reference,
  not a lower bound: when a device's activations are smaller than the weights
  (small batches), GSPMD keeps the weights in place and moves activations,
  and the ratio drops below 1;
- tensor parallel (Megatron pairing, mesh data x tensor): one all-reduce of the
  row-parallel layer's output activations [batch / data, hidden] over
  'tensor', plus the all-reduce over 'data' of each device's gradient
  (its 1/tensor slice of the split arrays and the replicated ones).

Bytes are per device and per operation, as the HLO states them: an all-reduce
counts its buffer, an all-gather its gathered output, a reduce-scatter its
input. Scalar reductions (metrics, the clipping norm) are included in the
measured figure and not in the minimum, so the ratio shows them.

Usage::

  python benchmarks/collectives.py            # writes benchmarks/results/collectives.json
  python benchmarks/collectives.py --out PATH # (or the path as the one argument)

Never asserts; the target is a ratio within 1.1.
"""

import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import argparse  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import purax  # noqa: E402
from purax import parallel  # noqa: E402
from jsonout import write_json  # noqa: E402  (beside this script)

KINDS = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute')
DTYPE_BYTES = {'f32': 4, 'f16': 2, 'bf16': 2, 's32': 4, 'u32': 4, 'f64': 8, 's64': 8,
               'u64': 8, 'pred': 1, 's8': 1, 'u8': 1}
OP = re.compile(r'=\s*(?P<shape>\([^=]*?\)|\S+)\s+(?P<kind>' + '|'.join(KINDS) +
                r')(?P<start>-start)?\(')
ARRAY = re.compile(r'(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]')
GROUPS_IOTA = re.compile(r'replica_groups=\[(?P<shape>[\d,]+)\]<=')
GROUPS_LIST = re.compile(r'replica_groups=\{\{(?P<first>[\d,]+)\}')

IN, HIDDEN, CLASSES, BATCH = 256, 512, 10, 64


def _bytes(shape_text: str) -> int:
  total = 0
  for m in ARRAY.finditer(shape_text):
    dims = [int(d) for d in m['dims'].split(',') if d]
    total += math.prod(dims) * DTYPE_BYTES.get(m['dtype'], 4)
  return total


def _group_size(line: str) -> int:
  if m := GROUPS_IOTA.search(line):
    return int(m['shape'].split(',')[-1])
  if m := GROUPS_LIST.search(line):
    return len(m['first'].split(','))
  return 1


def collectives(hlo: str) -> dict:
  """``{kind: {'count', 'bytes'}}`` of the collectives in compiled HLO text."""
  out = {}
  for line in hlo.splitlines():
    line = re.sub(r'/\*.*?\*/', '', line)      # /*index=5*/ comments in tuples
    m = OP.search(line)
    if not m:
      continue
    shape = m['shape']
    if m['start'] and shape.startswith('('):
      # async start ops return (operands, outputs): count the outputs half.
      arrays = ARRAY.findall(shape)
      shape = ' '.join(f'{d}[{s}]' for d, s in arrays[len(arrays) // 2:])
    nbytes = _bytes(shape)
    if m['kind'] == 'reduce-scatter':
      nbytes *= _group_size(line)       # count the input, as for all-reduce
    entry = out.setdefault(m['kind'], {'count': 0, 'bytes': 0})
    entry['count'] += 1
    entry['bytes'] += nbytes
  return out


def _task():
  return purax.Task(model=purax.nn.MLP(num_classes=CLASSES, features=(HIDDEN, HIDDEN)),
                    tx=purax.adamw(learning_rate=1e-3, total_steps=100))


def _batch():
  rng = np.random.default_rng(0)
  return {'x': rng.normal(size=(BATCH, IN)).astype(np.float32),
          'y': rng.integers(0, CLASSES, BATCH).astype(np.int32)}


def _param_bytes(state, sharding=None, split=False):
  total = 0
  leaves = jax.tree.leaves(state.params)
  specs = jax.tree.leaves(sharding.params) if sharding is not None else [None] * len(leaves)
  for x, s in zip(leaves, specs):
    is_split = s is not None and not s.is_fully_replicated
    if split is None or is_split == split:
      total += x.size * x.dtype.itemsize
  return total


def measure(name, mesh, rules=None, shard_map=False):
  task, batch = _task(), _batch()
  state = jax.eval_shape(task.init, jax.random.key(0), batch)
  if shard_map:
    compiled = _lower_shard_map(task, mesh).compile()
    sharding = None
  else:
    plan = parallel.sharded(task, mesh, rules, batch)
    compiled = plan.step.lower(state, batch).compile()
    sharding = plan.state_sharding
  found = collectives(compiled.as_text())
  total = sum(e['bytes'] for e in found.values())
  p_all = _param_bytes(state, None, None)
  if name == 'fsdp':
    p_split = _param_bytes(state, sharding, True)
    minimum = 2 * p_split + (p_all - p_split)
    detail = f'2 x {p_split} split + {p_all - p_split} replicated'
  elif name == 'tensor_parallel':
    t, d = mesh.shape['tensor'], mesh.shape['data'] * mesh.shape['fsdp']
    p_split = _param_bytes(state, sharding, True)
    activations = BATCH // d * HIDDEN * 4
    minimum = p_split // t + (p_all - p_split) + activations
    detail = (f'grads {p_split} / {t} split + {p_all - p_split} replicated; '
              f'activations [{BATCH // d}, {HIDDEN}] f32 = {activations}')
  else:
    minimum = p_all
    detail = f'one all-reduce of {p_all} gradient bytes'
  return {'strategy': name, 'mesh': dict(mesh.shape), 'collectives': found,
          'bytes': total, 'minimum_bytes': minimum, 'minimum': detail,
          'ratio': round(total / minimum, 4)}


def _lower_shard_map(task, mesh):
  from jax.sharding import PartitionSpec as P
  axes = ('data', 'fsdp')
  body = jax.shard_map(parallel.spmd._per_device_step(task, axes), mesh=mesh,
                       in_specs=(P(), P(axes)), out_specs=(P(), P()), check_vma=False)
  batch = _batch()
  state = jax.eval_shape(task.init, jax.random.key(0), batch)
  return jax.jit(body).lower(state, batch)


def main(out='benchmarks/results/collectives.json'):
  t0 = time.time()
  rows = [
      measure('data_parallel', parallel.make_mesh(data=8), parallel.data_parallel()),
      measure('fsdp', parallel.make_mesh(fsdp=8), parallel.fsdp(min_size=1024)),
      measure('tensor_parallel', parallel.make_mesh(data=4, tensor=2),
              parallel.tensor_parallel()),
      measure('shard_map_data_parallel', parallel.make_mesh(data=8), shard_map=True),
  ]
  result = {'model': f'MLP {IN}-{HIDDEN}-{HIDDEN}-{CLASSES}, batch {BATCH}, float32',
            'devices': jax.device_count(), 'backend': jax.default_backend(),
            'jax': jax.__version__, 'target_ratio': 1.1, 'results': rows,
            'seconds': round(time.time() - t0, 1)}
  write_json(out, result, say=False)
  print('| strategy | mesh | collectives (count, MiB) | bytes / minimum |')
  print('|---|---|---|---|')
  for r in rows:
    mesh = 'x'.join(f'{k}={v}' for k, v in r['mesh'].items() if v > 1)
    coll = ', '.join(f"{k} {v['count']}, {v['bytes'] / 2**20:.2f}"
                     for k, v in r['collectives'].items())
    print(f"| {r['strategy']} | {mesh} | {coll} | {r['ratio']:.3f} |")
  return result


def parse_args(argv):
  parser = argparse.ArgumentParser(
      description='Collectives in the compiled train step per strategy (8 CPU devices), '
                  'against the analytic minimum; writes JSON.')
  parser.add_argument('path', nargs='?', default=None, help='output JSON (same as --out)')
  parser.add_argument('--out', default='benchmarks/results/collectives.json',
                      help='output JSON (default: %(default)s)')
  args = parser.parse_args(argv)
  return args.path or args.out


if __name__ == '__main__':
  main(parse_args(sys.argv[1:]))
