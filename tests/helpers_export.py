"""The models the export tests convert, with random weights and statistics."""

import jax
import numpy as np
import optax

import purax
from purax.core import objectives


MODELS = {
    'cnn': (lambda: purax.nn.CNN(num_classes=10, features=(4, 8), hidden=16), (8, 8, 1),
            np.float32),
    'resnet': (lambda: purax.nn.ResNet(num_classes=10, stage_features=(4, 8)), (8, 8, 1),
               np.float32),
    'lm': (lambda: purax.nn.DecoderLM(d_model=16, num_layers=2, num_heads=2), (12,), np.int32),
}


def trained(name):
  """A task and a state of random weights and BatchNorm statistics: ``(task, state, x[7])``.

  The state's structure comes from ``jax.eval_shape(task.init, ...)`` (a
  trace, no compilation: an init or a training step would compile for
  seconds); parameters are N(0, 0.2), statistics (running means and
  variances) U(0.5, 1.5): values unlike the initial zeros and ones.
  """
  make, shape, dtype = MODELS[name]
  rng = np.random.default_rng(0)
  if dtype == np.int32:
    x = rng.integers(0, 256, (7, *shape)).astype(np.int32)
    batch, loss = {'x': x, 'y': x}, objectives.language_model
  else:
    x = rng.standard_normal((7, *shape)).astype(np.float32)
    batch, loss = {'x': x, 'y': np.zeros((7,), np.int32)}, objectives.classification
  task = purax.Task(model=make(), tx=optax.sgd(0.1), loss=loss)
  abstract = jax.eval_shape(task.init, jax.random.key(0), batch)
  fill = lambda f: lambda a: np.asarray(f(a.shape), a.dtype)
  state = abstract.replace(
      params=jax.tree.map(fill(lambda s: 0.2 * rng.standard_normal(s)), abstract.params),
      model_state=jax.tree.map(fill(lambda s: 0.5 + rng.random(s)), abstract.model_state),
      hparams=jax.tree.map(fill(np.zeros), abstract.hparams))
  return task, state, x
