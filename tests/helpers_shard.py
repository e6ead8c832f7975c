"""What the tests of sharding share (tests/parallel/test_shard.py,
test_rules.py): a small MLP task, a batch, and its state (made once)."""

import functools

import jax
import numpy as np

import purax

TASK = purax.Task(model=purax.nn.MLP(num_classes=4, features=(64, 64)),
                  tx=purax.adamw(learning_rate=1e-2, total_steps=10))
BATCH = {'x': np.zeros((16, 32), np.float32), 'y': np.zeros((16,), np.int32)}


@functools.cache
def state():
  return jax.jit(TASK.init)(jax.random.key(0), BATCH)
