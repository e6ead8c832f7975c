"""What the tests of ``fit(steps_per_call=...)`` share (tests/plan/test_single.py,
tests/plan/test_auto.py): 12 batches of a small MLP, one of them non-finite,
and a fit of them."""

import jax
import numpy as np

import purax
from purax.nn import MLP

STEPS = 12


def batches():
  out = []
  for i in range(STEPS):
    rng = np.random.default_rng(i)
    b = {'x': rng.normal(size=(8, 5)).astype(np.float32),
         'y': rng.integers(0, 3, 8).astype(np.int32)}
    if i == 5:
      b['x'][0, 0] = np.nan        # a non-finite step: skipped, counted
    out.append(b)
  return out


def task():
  return purax.Task(model=MLP(num_classes=3, features=(16,), dropout_rate=0.1),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=STEPS))


def run(k, state=None, steps=None, **kw):
  t = task()
  state = state or t.init(jax.random.key(0), batches()[0])
  hooks = purax.hooks.standard(**{'log_every': 4, 'progress': False, **kw})
  return purax.fit(t, state, batches(), steps=steps, steps_per_call=k, hooks=hooks)
