"""Small shared fixtures for the tests: tiny tasks and batches."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

import purax
import purax.testing
from purax import nn as pnn


def tiny_batch(n=8, shape=(8, 8, 1), classes=10, seed=0, weight=False):
  rng = np.random.default_rng(seed)
  batch = {'x': rng.normal(size=(n, *shape)).astype(np.float32),
           'y': rng.integers(0, classes, size=(n,)).astype(np.int32)}
  if weight:
    batch['weight'] = rng.uniform(0.0, 1.0, size=(n,)).astype(np.float32)
  return batch


def tiny_task(model='mlp', *, classes=10, learning_rate=1e-2, total_steps=100, **kwargs):
  models = {
      'mlp': lambda: pnn.MLP(num_classes=classes, features=(16,), **kwargs),
      'cnn': lambda: pnn.CNN(num_classes=classes, features=(4, 8), hidden=16, **kwargs),
      'resnet': lambda: pnn.ResNet(num_classes=classes, stage_features=(4, 8), **kwargs),
  }
  tx = purax.adamw(learning_rate=learning_rate, total_steps=total_steps, warmup_steps=0)
  return purax.Task(model=models[model](), tx=tx)


def assert_bitwise(a, b, what='state'):
  """``a`` and ``b`` equal bit for bit, leaf by leaf (typed keys by key data),
  naming the first leaf that differs: the suite's one bitwise assert."""
  purax.testing.assert_trees_close(a, b, purax.testing.Tolerance(0.0, 0.0), what=what)


def tree_equal(a, b):
  leaves_a, tree_a = jax.tree.flatten(a)
  leaves_b, tree_b = jax.tree.flatten(b)
  if tree_a != tree_b:
    return False
  return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(leaves_a, leaves_b))


def params_differ(a, b):
  return any(not np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def with_hyperparam(state, name, value, member=None):
  """``state`` with every ``opt_state`` leaf named ``name`` (an injected
  hyperparameter) set to ``value`` by plain tree surgery, past the setters'
  checks; ``member``: only that member's entry of a stacked state."""
  def put(path, x):
    if not jax.tree_util.keystr(path).endswith(f"['{name}']"):
      return x
    return jnp.full_like(x, value) if member is None else x.at[member].set(value)
  return state.replace(opt_state=jax.tree_util.tree_map_with_path(put, state.opt_state))


@contextlib.contextmanager
def compilations():
  """Yields a list that collects one entry per XLA compilation inside: a
  backend compile, or a load of the same executable from the suite's
  persistent compilation cache (which stands in for one)."""
  events = []
  listener = lambda event, *a, **k: events.append(event) if 'backend_compile' in event \
      else None   # noqa: E731
  hits = lambda event, *a, **k: events.append(event) if event.endswith('/cache_hits') \
      else None   # noqa: E731
  jax.monitoring.register_event_duration_secs_listener(listener)
  jax.monitoring.register_event_listener(hits)
  try:
    yield events
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
    jax.monitoring.unregister_event_listener(hits)


__all__ = ['tiny_batch', 'tiny_task', 'tree_equal', 'params_differ', 'jnp']


def refilling(batches):
  """The batches yielded by a loader that refills one preallocated batch: every
  item is the same dict of the same arrays, at 4096-byte-aligned addresses
  (XLA:CPU may use such numpy memory in place rather than copy it)."""
  def aligned_like(x):
    raw = np.empty(x.nbytes + 4096, np.uint8)
    start = -raw.ctypes.data % 4096
    return raw[start:start + x.nbytes].view(x.dtype).reshape(x.shape)

  out = {k: aligned_like(np.asarray(v)) for k, v in batches[0].items()}
  for batch in batches:
    for key in out:
      out[key][...] = batch[key]
    yield out
