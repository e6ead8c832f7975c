"""What the tests of the Log hook and its metrics window share
(tests/hooks/test_builtin.py, test_window.py): 12 tiny batches and an MLP task
on a warmup-cosine schedule whose features each test picks (a compilation no
other test made)."""

import purax
from tests.helpers import tiny_batch

PEAK, WARMUP, STEPS = 1e-2, 4, 12
DATA = [tiny_batch(seed=s) for s in range(STEPS)]


def task(features=(13,)):
  """An MLP no other test compiles (its first fit here compiles for sure)."""
  return purax.Task(model=purax.nn.MLP(num_classes=10, features=features),
                    tx=purax.adamw(learning_rate=PEAK, total_steps=STEPS, warmup_steps=WARMUP))
