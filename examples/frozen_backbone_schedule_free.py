"""Fine-tuning a head on a frozen backbone with schedule-free AdamW. A "pretrained"
MLP (a short AdamW run on digits) gets a new head; `optax.multi_transform` trains only
the head, with `optax.contrib.schedule_free_adamw`, and leaves the backbone bitwise as
it was. Schedule-free trains the gradient points y and should be evaluated at their
average x: `purax.Task(eval_params=...)` makes `evaluate`, `predict`, the run's
`eval/*` and best-k checkpoints use x. `PURAX_EXAMPLE_TINY=1`: a few steps."""
import os
import jax
import numpy as np
import optax
import purax
from purax.core.optimizers import schedule_free_eval_params

STEPS = 8 if os.environ.get('PURAX_EXAMPLE_TINY') else 300
data = purax.io.datasets.load('digits')
train = purax.io.pipeline.train_dataset(data.x_train, data.y_train, batch_size=64, seed=0,
                                        num_steps=STEPS)
test = [{'x': data.x_test, 'y': data.y_test}]
model = purax.nn.MLP(num_classes=10, features=(64, 64))     # Dense_0, Dense_1: the backbone

# 1. "Pretraining": every parameter, AdamW.
pretrain = purax.Task(model=model, tx=purax.adamw(learning_rate=3e-3, total_steps=STEPS))
state, _ = purax.fit(pretrain, jax.jit(pretrain.init)(jax.random.key(0), train[0]), train,
                     hooks=[])

# 2. Fine-tuning: a fresh head (Dense_2), the backbone frozen (set_to_zero: no update).
def labels(params):
  return {name: jax.tree.map(lambda _: 'head' if name == 'Dense_2' else 'frozen', leaves)
          for name, leaves in params.items()}

tx = optax.multi_transform({'head': optax.contrib.schedule_free_adamw(1e-2, warmup_steps=2),
                            'frozen': optax.set_to_zero()}, labels)
task = purax.Task(model=model, tx=tx, eval_params=schedule_free_eval_params)
fresh = jax.jit(task.init)(jax.random.key(1), train[0])
params = {**state.params, 'Dense_2': fresh.params['Dense_2']}
backbone = jax.tree.map(np.array, {k: v for k, v in params.items() if k != 'Dense_2'})
state = fresh.replace(params=params, opt_state=tx.init(params))
state, _ = purax.fit(task, state, train, hooks=[])

if __name__ == '__main__':
  unchanged = all(np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(backbone), jax.tree.leaves({k: v for k, v in state.params.items()
                                                  if k != 'Dense_2'})))
  at_x = purax.evaluate(task, state, test)['accuracy']             # the average x
  at_y = purax.evaluate(purax.Task(model=model, tx=tx), state, test)['accuracy']
  print(f'frozen_backbone_schedule_free: steps {STEPS}, backbone bitwise unchanged '
        f'{unchanged}, test accuracy at x {at_x:.3f}, at y {at_y:.3f}')
