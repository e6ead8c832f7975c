"""Training from a grain IterDataset and from a plain Python generator. A run from the
IterDataset is interrupted at half time, then resumed with `purax.restore_or_init`:
the checkpointed iterator position (`data_state`) makes the resumed run bitwise the
straight one. A generator has no position: its resume replays it (`iterator_resume=
'skip'`, exact for a deterministic generator). `PURAX_EXAMPLE_TINY=1`: a few steps."""
import os
import tempfile
import grain
import jax
import numpy as np
import purax
from purax import testing
from purax.io.checkpoint import Checkpointer

STEPS = 6 if os.environ.get('PURAX_EXAMPLE_TINY') else 200
data = purax.io.datasets.load('digits')
task = purax.Task(model=purax.nn.MLP(num_classes=10, features=(128,), dropout_rate=0.1),
                  tx=purax.adamw(learning_rate=3e-3, total_steps=STEPS))   # loss: classification

def grain_batches():
  """Shuffled every epoch, 64 examples a batch: {'x': float32 [64, 8, 8, 1], 'y': int32 [64]}."""
  examples = grain.MapDataset.source(list(zip(data.x_train, data.y_train)))
  return (examples.repeat().shuffle(seed=0).map(lambda e: {'x': e[0], 'y': e[1]})
          .batch(64).to_iter_dataset())

def generator(seed=0):
  rng = np.random.default_rng(seed)
  while True:
    rows = rng.permutation(len(data.x_train))[:64]
    yield {'x': data.x_train[rows], 'y': data.y_train[rows]}

def train(source, directory, steps=STEPS, **resume):
  """Trains to `steps`, from the newest checkpoint in `directory` if there is one."""
  restored = purax.restore_or_init(directory, task, jax.random.key(0), next(iter(source())))
  ckpt = Checkpointer(directory)
  state, _ = purax.fit(task, restored, source(), steps=steps, **resume, hooks=purax.hooks.standard(log_every=STEPS, progress=False, checkpointer=ckpt))
  ckpt.close()
  return state

if __name__ == '__main__':
  test = [{'x': data.x_test, 'y': data.y_test}]
  for name, source, resume in [('grain IterDataset', grain_batches, {}),
                               ('generator', generator, {'iterator_resume': 'skip'})]:
    with tempfile.TemporaryDirectory() as straight_dir, tempfile.TemporaryDirectory() as directory:
      straight = train(source, straight_dir)
      train(source, directory, steps=STEPS // 2)             # "preempted" at half time
      resumed = train(source, directory, **resume)
    testing.assert_trees_close(resumed, straight, testing.Tolerance(0.0, 0.0), what=name)
    print(f'data_sources: {name}: {STEPS} steps, resumed run bitwise equal to the straight '
          f'one, test accuracy {purax.evaluate(task, resumed, test)["accuracy"]:.3f}')
