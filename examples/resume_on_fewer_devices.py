"""A run on 8 devices, "preempted" at half time, resumed on 4 (a smaller slice, the
same global batch): `purax.restore_or_init(..., plan=)` restores the checkpoint onto
the new mesh, the data position (a count of global batches) carries over, and the run
ends with the params of the uninterrupted 8-device run to float rounding (not
bitwise: the gradient all-reduce adds the devices' parts in another order). Resuming
on another global batch is refused by name. `PURAX_EXAMPLE_TINY=1`: a few steps."""
import os
os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')   # before jax
import functools
import tempfile
import jax
import numpy as np
import purax
from purax import parallel, testing

STEPS = 6 if os.environ.get('PURAX_EXAMPLE_TINY') else 200
data = purax.io.datasets.load('digits')
task = purax.Task(model=purax.nn.MLP(num_classes=10, features=(64,)),
                  tx=purax.adamw(learning_rate=3e-3, total_steps=STEPS))
def batches(size=64):
  """The global batches, random access by step: batch s is the same on any mesh."""
  return purax.io.pipeline.train_dataset(data.x_train, data.y_train, batch_size=size, seed=0,
                                         num_steps=STEPS)

@functools.cache   # one plan (one compiled step) per mesh
def plan_on(devices):
  mesh = parallel.make_mesh(data=devices, devices=jax.devices()[:devices])
  return parallel.sharded(task, mesh, parallel.data_parallel(), batches()[0])

def train(directory, devices, steps=STEPS, data=None):
  """Trains to `steps` on `devices` devices, from the newest checkpoint if any."""
  plan = plan_on(devices)
  restored = purax.restore_or_init(directory, task, jax.random.key(0), batches()[0], plan=plan)
  with purax.Checkpointer(directory) as ckpt:
    state, _ = purax.fit(task, restored, data or batches(), steps=steps, plan=plan,
                         hooks=purax.hooks.standard(progress=False, checkpointer=ckpt))
  return restored.step, state

if __name__ == '__main__':
  with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
    _, straight = train(a, 8)
    train(b, 8, steps=STEPS // 2)                      # preempted at half time
    try:
      train(b, 4, data=batches(32))                    # half the global batch: refused
    except purax.ConfigError as e:
      refused = str(e).split(' (')[0]
    start, resumed = train(b, 4)                       # the same global batch on 4 devices
  diff = max(float(np.max(np.abs(x - y))) for x, y in zip(
      jax.tree.leaves(jax.device_get(straight.params)),
      jax.tree.leaves(jax.device_get(resumed.params))))
  testing.assert_trees_close(resumed.params, straight.params,
                             testing.Tolerance(rtol=1e-5, atol=1e-6))
  print(f'resume_on_fewer_devices: {STEPS} steps, 8 devices to 4 at step {start}, '
        f'max |params difference| {diff:.1e}, refused: {refused}')
