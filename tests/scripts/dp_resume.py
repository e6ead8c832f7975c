"""Data-parallel training on N host devices, saving or restoring mid-way.

Usage: python -m tests.scripts.dp_resume DEVICES MODE WORKDIR
  MODE straight: 6 steps, a checkpoint after 3 in WORKDIR/checkpoints (waited
                 for before step 4), writes WORKDIR/params.npz
  MODE second:   restore that checkpoint onto DEVICES devices, 3 more steps,
                 writes WORKDIR/params-DEVICES.npz
"""

import os
import sys

devices, mode, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={devices}' + ' ' + os.environ.get('PURAX_TEST_CHILD_XLA_FLAGS', '')

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from purax.io.checkpoint import Checkpointer  # noqa: E402
from tests.helpers import tiny_batch, tiny_task  # noqa: E402

assert jax.device_count() == devices
mesh = jax.make_mesh((devices,), ('data',))
replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))
task = tiny_task('resnet', classes=10)
batches = [tiny_batch(n=16, seed=s) for s in range(6)]


def place_batch(batch):
  return jax.device_put(batch, split)


abstract = jax.eval_shape(task.init, jax.random.key(0), batches[0])
state_shardings = jax.tree.map(lambda _: replicated, abstract)
step = jax.jit(task.step, in_shardings=(state_shardings, split),
               out_shardings=(state_shardings, replicated), donate_argnums=0)
with jax.default_matmul_precision('highest'):
  if mode == 'second':
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                          abstract)
    with Checkpointer(os.path.join(workdir, 'checkpoints')) as ckpt:
      tree, _, at = ckpt.restore({'state': target})
    state = tree['state']
    kernel = state.params['Dense_0']['kernel']
    assert at == 3 and kernel.sharding.is_equivalent_to(replicated, kernel.ndim)
  else:
    state = jax.jit(task.init, out_shardings=state_shardings)(jax.random.key(0), batches[0])
  start = int(state.step)
  for s in range(start, 6):
    state, _ = step(state, place_batch(batches[s]))
    if mode == 'straight' and s + 1 == 3:
      with Checkpointer(os.path.join(workdir, 'checkpoints')) as ckpt:
        ckpt.save(3, {'state': state})
  name = 'params.npz' if mode == 'straight' else f'params-{devices}.npz'
  flat = {jax.tree_util.keystr(p): np.asarray(x) for p, x in
          jax.tree_util.tree_flatten_with_path({'params': state.params,
                                                'model_state': state.model_state,
                                                'mu': state.opt_state})[0]
          if hasattr(x, 'dtype') and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)}
  np.savez(os.path.join(workdir, name), **flat)
