"""A run with the loss-spike guard, stopped and resumed in fresh processes
(tests/core/test_spikes.py): batch 7 is a spike.

usage: spike_run.py CHECKPOINT_DIR STOP_AT OUT.npz   (STOP_AT 0: run to the end)
Prints ``final step N spikes S`` (S: the spikes this process counted) and saves
the final state's params, optimizer moments and spike window to OUT.npz.
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
  scale = 300.0 if i == 7 else 1.0
  return {'x': (rng.normal(size=(8, 4)) * scale).astype(np.float32),
          'y': rng.integers(0, 3, 8).astype(np.int32)}


def main(directory, stop_at, out):
  task = purax.Task(model=MLP(num_classes=3, features=(8,)),
                    tx=purax.adamw(learning_rate=3e-2, total_steps=10),
                    spike_guard=purax.SpikeGuard(window=6, k=3.0))
  restored = purax.restore_or_init(directory, task, jax.random.key(0), batch(0))
  ckpt = Checkpointer(directory)
  steps = itertools.count(restored.step + 1)      # should_stop is polled after every step
  state, history = purax.fit(task, restored, [batch(i) for i in range(10)],
                             hooks=purax.hooks.standard(
                                 log_every=1, progress=False, checkpointer=ckpt,
                                 should_stop=lambda: bool(stop_at) and next(steps) >= stop_at))
  ckpt.close()
  flat = {jax.tree_util.keystr(p).replace("'", ''): np.asarray(x) for p, x in
          jax.tree_util.tree_flatten_with_path(
              {'params': state.params, 'opt_state': state.opt_state,
               'spike_window': state.spike_window})[0]}
  flat = {k.strip('[]').replace('][', '/').replace('].', '.').replace('[', '/'): v
          for k, v in flat.items()}
  np.savez(out, **flat)
  spikes = sum(int(h.get('train/spikes', 0)) for h in history)
  print(f'final step {int(state.step)} spikes {spikes}')


if __name__ == '__main__':
  main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
