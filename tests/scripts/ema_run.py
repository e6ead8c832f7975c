"""A run with an EMA of the params, stopped and resumed in fresh processes
(tests/hooks/test_resume.py).

usage: ema_run.py CHECKPOINT_DIR STOP_AT OUT.npz   (STOP_AT 0: run to the end)
Prints ``final step N samples S`` and saves the average, its sample count and
the final params to OUT.npz.
"""

import itertools
import sys

import jax
import numpy as np

import purax
from purax.io.checkpoint import Checkpointer
from purax.nn import MLP


def batch(i):
  rng = np.random.default_rng(i)
  return {'x': rng.normal(size=(8, 4)).astype(np.float32),
          'y': rng.integers(0, 3, 8).astype(np.int32)}


def main(directory, stop_at, out):
  task = purax.Task(model=MLP(num_classes=3, features=(8,)),
                    tx=purax.adamw(learning_rate=3e-2, total_steps=10))
  ema = purax.hooks.EMA(decay=0.9, every=2)
  restored = purax.restore_or_init(directory, task, jax.random.key(0), batch(0), hooks=[ema])
  ckpt = Checkpointer(directory)
  steps = itertools.count(restored.step + 1)      # should_stop is polled after every step
  state, _ = purax.fit(task, restored, [batch(i) for i in range(10)], hooks=purax.hooks.standard(log_every=1, progress=False, checkpointer=ckpt, should_stop=lambda: bool(stop_at) and next(steps) >= stop_at) + list([ema]))
  ckpt.close()
  flat = {f'ema{jax.tree_util.keystr(p)}': np.asarray(x) for p, x in
          jax.tree_util.tree_flatten_with_path(ema.params)[0]}
  flat.update({f'params{jax.tree_util.keystr(p)}': np.asarray(x) for p, x in
               jax.tree_util.tree_flatten_with_path(state.params)[0]})
  np.savez(out, count=np.asarray(ema.arrays['count']), **flat)
  print(f'final step {int(state.step)} samples {int(ema.arrays["count"])}')


if __name__ == '__main__':
  main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
