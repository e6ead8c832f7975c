"""A population with PBT and loss-scale counters, stopped and resumed in fresh
processes (tests/hooks/test_resume.py). usage: population_resume.py DIR STOP_AT OUT.npz"""

import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np

import purax
from purax.core import population
from purax.nn import MLP


def batch(i):
  rng = np.random.default_rng(i)
  return {'x': rng.normal(size=(8, 4)).astype(np.float32),
          'y': rng.integers(0, 3, 8).astype(np.int32)}


def main(directory, stop_at, out):
  task = purax.Task(model=MLP(num_classes=3, features=(8,)), loss_scale=2.0 ** 15,
                    tx=purax.adamw(learning_rate=1e-2, total_steps=8))
  keys = jax.vmap(jax.random.key)(jnp.arange(4))
  fresh = population.init(task, keys, {'learning_rate': jnp.array([1e-3, 3e-3, 1e-2, 3e-2])},
                          batch(0))
  ckpt = purax.Checkpointer(directory)
  window = jax.eval_shape(lambda p, b: population.step(task, p, b)[1], fresh, batch(0))
  restored = (ckpt.restore(jax.eval_shape(lambda: {'state': fresh, 'train_metrics': window}))
              if ckpt.steps() else None)
  pop, acc = (fresh, None) if restored is None else (restored[0]['state'],
                                                    restored[0]['train_metrics'])
  start = 0 if restored is None else restored[2]
  steps = itertools.count(start + 1)
  hook = purax.hooks.PBT(every=2, fraction=0.25, key=jax.random.key(7))
  pop, _ = purax.fit(task, purax.io.checkpoint.run.Restored(pop, acc, start, None, {}), [batch(i) for i in range(8)], plan=purax.plan.PopulationPlan(task), hooks=purax.hooks.standard(log_every=2, progress=False, eval_data=[batch(99)], eval_every=2, checkpointer=ckpt, should_stop=lambda: bool(stop_at) and next(steps) >= stop_at, max_consecutive_skips=None) + list([hook]))
  ckpt.close()
  leaves = jax.tree_util.tree_flatten_with_path(jax.tree.map(
      lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x,
      pop))[0]
  np.savez(out, **{jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves})
  print('final step', int(np.max(np.asarray(pop.state.step))))


if __name__ == '__main__':
  main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
