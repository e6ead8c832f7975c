"""A bfloat16 run tracks the float32 run on digits."""

import jax
import numpy as np

import purax
from purax.core.precision import get_policy
from purax.io import datasets, pipeline


def run(precision, steps=300):
  ds = datasets.load('digits')
  model = purax.nn.CNN(num_classes=10, **get_policy(precision).model_kwargs())
  task = purax.Task(model=model, tx=purax.adamw(learning_rate=2e-3, total_steps=steps,
                                                warmup_steps=30))
  train = pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=64, seed=0, num_steps=steps)
  evals = pipeline.eval_batches(ds.x_test, ds.y_test, batch_size=360)
  state = task.init(jax.random.key(0), train[0])
  _, history = purax.fit(task, state, train, hooks=purax.hooks.standard(log_every=50, progress=False, eval_data=evals))
  losses = [h['train/loss'] for h in history if 'train/loss' in h]
  return np.array(losses), history[-1]['eval/accuracy']


def test_bf16_tracks_fp32_loss_over_300_steps():
  """Tolerance: each 50-step window's mean train loss within 0.05 + 15% of the
  float32 run's (bfloat16 keeps 8 bits of mantissa: activations differ by
  ~0.4% per op, and the windows' losses fall from ~2.3 to ~0.01), and the
  final test accuracy within 2 points."""
  fp32_loss, fp32_acc = run('fp32')
  bf16_loss, bf16_acc = run('bf16')
  assert fp32_loss[-1] < 0.1 * fp32_loss[0]          # both runs actually learn
  np.testing.assert_array_less(np.abs(bf16_loss - fp32_loss), 0.05 + 0.15 * fp32_loss)
  assert abs(bf16_acc - fp32_acc) <= 0.02
  print('fp32', fp32_loss.round(4), fp32_acc, 'bf16', bf16_loss.round(4), bf16_acc)
