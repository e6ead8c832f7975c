"""Data-parallel training on N host devices with the public API, saving or
restoring mid-way (purax.fit on a sharded plan, purax.restore_or_init(plan=)).

Usage: python -m tests.scripts.dp_resume DEVICES MODE WORKDIR
  MODE straight: 6 steps on a data=DEVICES mesh, its checkpoint after 3 in
                 WORKDIR/checkpoints, writes WORKDIR/params.npz
  MODE second:   restore that checkpoint onto a data=DEVICES mesh, train on to
                 step 6, writes WORKDIR/params-DEVICES.npz
"""

import os
import sys

devices, mode, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={devices}' + ' ' + os.environ.get('PURAX_TEST_CHILD_XLA_FLAGS', '')

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import purax  # noqa: E402
from purax import parallel  # noqa: E402
from tests.helpers import tiny_batch, tiny_task  # noqa: E402

assert jax.device_count() == devices
task = tiny_task('resnet', classes=10)
batches = [tiny_batch(n=16, seed=s) for s in range(6)]
plan = parallel.sharded(task, parallel.make_mesh(data=devices), parallel.data_parallel(),
                        batches[0])
directory = os.path.join(workdir, 'checkpoints')
quiet = dict(log_every=3, progress=False)
with jax.default_matmul_precision('highest'):
  if mode == 'second':
    restored = purax.restore_or_init(directory, task, jax.random.key(0), batches[0], plan=plan,
                                     must_exist=True)
    kernel = restored.state.params['Dense_0']['kernel']
    assert restored.step == 3 and kernel.sharding.spec == P() and len(kernel.devices()) == devices
    state, _ = purax.fit(task, restored, batches, plan=plan, hooks=purax.hooks.standard(**quiet))
  else:
    with purax.Checkpointer(directory) as ckpt:
      state, _ = purax.fit(task, plan.init(jax.random.key(0)), batches, steps=3, plan=plan,
                           hooks=purax.hooks.standard(checkpointer=ckpt, **quiet))
    state, _ = purax.fit(task, state, batches, plan=plan, hooks=purax.hooks.standard(**quiet))
  name = 'params.npz' if mode == 'straight' else f'params-{devices}.npz'
  flat = {jax.tree_util.keystr(p): np.asarray(x) for p, x in
          jax.tree_util.tree_flatten_with_path({'params': state.params,
                                                'model_state': state.model_state,
                                                'mu': state.opt_state})[0]
          if hasattr(x, 'dtype') and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)}
  np.savez(os.path.join(workdir, name), **flat)
