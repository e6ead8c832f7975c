"""Shared population fixtures: a tiny task, its batches, keys and the
standalone run a member is compared with (tests/core/test_population.py
states the tolerance)."""

import jax
import jax.numpy as jnp
import numpy as np

import purax
from purax.core import metrics as metrics_lib
from purax.core import population as P
from purax.nn import MLP

RTOL, ATOL = 1e-5, 1e-6
CLASSES, FEATURES, BATCH = 3, 6, 8


def make_task(param_dtype=jnp.float32):
  return purax.Task(model=MLP(num_classes=CLASSES, features=(16,), param_dtype=param_dtype),
                    tx=purax.adamw(learning_rate=1e-3, total_steps=10, warmup_steps=0))


TASK = make_task()   # one task, so every example reuses the compiled programs
pstep = jax.jit(P.step, static_argnums=0)
pinit = jax.jit(P.init, static_argnums=0)
sstep = jax.jit(TASK.step)
sinit = jax.jit(lambda key, hp, b: purax.set_hyperparams(TASK.init(key, b), hp))


def batch(seed=0, n=BATCH):
  rng = np.random.default_rng(seed)
  return {'x': rng.normal(size=(n, FEATURES)).astype(np.float32),
          'y': rng.integers(0, CLASSES, size=(n,)).astype(np.int32)}


def stacked_batches(seeds):
  bs = [batch(s) for s in seeds]
  return {k: np.stack([b[k] for b in bs]) for k in bs[0]}


def keys(seeds):
  return jax.vmap(jax.random.key)(jnp.asarray(seeds))


def standalone(seed, hparams, batches, k):
  state = sinit(jax.random.key(seed), hparams, batches[0])
  history = []
  for s in range(k):
    state, m = sstep(state, batches[s % len(batches)])
    history.append(metrics_lib.compute(m))
  return state, history
