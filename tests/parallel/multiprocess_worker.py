"""One process of the two-process test: ``python multiprocess_worker.py ID N PORT OUT``.

Runs K FSDP steps of a small MLP on a mesh over the devices of all processes
(2 CPU devices each), feeding only this process's rows of every global batch,
and writes the gathered params to ``OUT`` (npz) from process 0.
"""

import os
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

import purax
from purax import parallel

STEPS, BATCH = 3, 16


def task():
  return purax.Task(model=purax.nn.MLP(num_classes=4, features=(16, 16)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=10))


def batches():
  rng = np.random.default_rng(0)
  return [{'x': rng.normal(size=(BATCH, 8)).astype(np.float32),
           'y': rng.integers(0, 4, BATCH).astype(np.int32)} for _ in range(STEPS)]


def train(mesh, rules, *, distributed: bool):
  t, data = task(), batches()
  plan = parallel.sharded(t, mesh, rules, data[0])
  state = plan.init(jax.random.key(0))
  rows = parallel.distributed.process_rows(mesh, rules, BATCH)
  for batch in data:
    local = {k: v[rows] for k, v in batch.items()}
    global_batch = (parallel.distributed.global_batch(local, mesh, rules) if distributed
                    else plan.shard_batch(batch))
    state, _ = plan.step(state, global_batch)
  return state.params


def main(process_id, num_processes, port, out):
  started = parallel.distributed.initialize(f'localhost:{port}', num_processes, process_id)
  assert started and not parallel.distributed.initialize(f'localhost:{port}',
                                                         num_processes, process_id)
  assert jax.device_count() == 2 * num_processes and jax.local_device_count() == 2
  mesh = parallel.make_mesh(data=2, fsdp=-1)
  with jax.default_matmul_precision('highest'):
    params = train(mesh, parallel.fsdp(min_size=64), distributed=True)
  params = multihost_utils.process_allgather(params, tiled=True)
  if parallel.distributed.is_main_process():
    flat = {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_leaves_with_path(params)}
    np.savez(out, **flat)
  parallel.distributed.shutdown()


if __name__ == '__main__':
  # Read when the backend starts (first device use), not at import: importing
  # this module from the test leaves the test process's 8 devices alone.
  os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=2' + ' ' + os.environ.get('PURAX_TEST_CHILD_XLA_FLAGS', '')
  os.environ['JAX_PLATFORMS'] = 'cpu'
  main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
