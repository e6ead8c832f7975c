"""A sweep of the own loss's temperature x the learning rate as one compiled population
(every member a whole training run, vmapped), scored on the test set by the
temperature-free in-batch nearest-neighbour accuracy; the best member then continues
as an ordinary single run with `purax.fit`. `PURAX_EXAMPLE_TINY=1`: a few steps."""
import os
import itertools
import jax
import jax.numpy as jnp
import purax
from purax.core import population
from purax.plan import members
from own_model_contrastive import Embed, digit_batches, supcon

TINY = bool(os.environ.get('PURAX_EXAMPLE_TINY'))
SWEEP, MORE = (4, 2) if TINY else (150, 150)
GRID = list(itertools.product([0.05, 0.1, 0.3], [1e-3, 3e-3, 1e-2]))   # (temperature, lr)

if __name__ == '__main__':
  data = purax.io.datasets.load('digits')
  test = {'x': data.x_test, 'y': data.y_test}
  batches = digit_batches(data.x_train, data.y_train, SWEEP + MORE)
  task = purax.Task(model=Embed(), tx=purax.adamw(total_steps=SWEEP + MORE), loss=supcon)
  keys = jax.vmap(jax.random.key)(jnp.zeros(len(GRID), jnp.int32))   # same init for every member
  hparams = {'temperature': jnp.array([t for t, _ in GRID]),
             'learning_rate': jnp.array([lr for _, lr in GRID])}
  pop = population.init(task, keys, hparams, batches[0])
  acc = members.zero_train_metrics(task, pop, batches[0])
  for batch in batches[:SWEEP]:
    pop, acc = members.train_step(task, pop, acc, batch, None)   # one program for all
  scores = jax.jit(population.evaluate, static_argnums=0)(task, pop, test)
  accuracy = purax.metrics.compute(scores)['nn_accuracy']
  for (t, lr), a, status in zip(GRID, accuracy, population.status(pop)):
    print(f'  temperature {t:<5} lr {lr:<6} test nn_accuracy {a:.3f} ({status})')
  best = int(jnp.argmin(population.score(scores, 'nn_accuracy', mode='max')))
  state = population.member(pop, best)
  hparams = purax.hyperparams(state)   # learning_rate: the schedule's peak, as set
  now = float(purax.hyperparams(state, task.tx)['learning_rate'])   # the rate it is at now
  print(f'best member {best}:', {k: float(f'{v:.4g}') for k, v in hparams.items()},
        f'learning rate now {now:.4g}')
  state, _ = purax.fit(task, state, batches, hooks=purax.hooks.standard(log_every=MORE, progress=False))
  final = purax.evaluate(task, state, [test])
  print(f'sweep_population: best temperature {GRID[best][0]}, lr {GRID[best][1]}, '
        f'continued to step {int(state.step)}: test nn_accuracy {final["nn_accuracy"]:.3f}, '
        f'loss {final["loss"]:.4f}')
