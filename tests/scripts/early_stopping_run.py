"""A run with early stopping, stopped and resumed in fresh processes (tests/hooks/test_resume.py).

usage: early_stopping_run.py CHECKPOINT_DIR STOP_AT   (STOP_AT 0: run to the end)
Prints ``final step N stale S kept [STEPS]``: early stopping on the eval loss,
and the checkpoints kept (the newest, and the best by ``train/loss``, the
Checkpointer's ``best_metric``: any logged metric).
"""

import itertools
import sys

import jax
import numpy as np
import optax

import purax
from purax.io.checkpoint import Checkpointer
from purax.nn import MLP


def batch(i):
  rng = np.random.default_rng(i)
  return {'x': rng.normal(size=(8, 4)).astype(np.float32),
          'y': rng.integers(0, 3, 8).astype(np.int32)}


def main(directory, stop_at):
  # A learning rate of 0: the eval loss never improves after the first evaluation,
  # so patience 3 at every 2nd step stops the run at step 8.
  task = purax.Task(model=MLP(num_classes=3, features=(8,)), tx=optax.sgd(0.0))
  restored = purax.restore_or_init(directory, task, jax.random.key(0), batch(0))
  hook = purax.hooks.EarlyStopping(metric='loss', patience=3)
  ckpt = Checkpointer(directory, keep_last=1, keep_best=1, best_metric='train/loss',
                      best_mode='min')
  steps = itertools.count(restored.step + 1)      # should_stop is polled after every step
  state, _ = purax.fit(task, restored, [batch(i) for i in range(40)], hooks=purax.hooks.standard(
      log_every=2, progress=False, eval_data=[batch(99)], eval_every=2, checkpointer=ckpt,
      checkpoint_every=2, should_stop=lambda: bool(stop_at) and next(steps) >= stop_at)
      + list([hook]))
  ckpt.wait()
  kept = ckpt.steps()
  ckpt.close()
  print(f'final step {int(state.step)} stale {hook.stale} kept {kept}')

if __name__ == '__main__':
  _directory, _stop_at = sys.argv[1], int(sys.argv[2])
  main(_directory, _stop_at)
