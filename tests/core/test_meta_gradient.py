"""Issue 27.6: differentiating through training. ``jax.grad`` and ``jax.jvp`` of
the loss after k steps of ``Task.step`` with respect to the learning rate
match central finite differences (float64), with and without the non-finite
guard, given ``eps_root > 0``; with ``eps_root = 0`` (Adam as published) the
meta-gradient is NaN, which is why the option exists."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purax
from purax.io import datasets

K = 3
_DIGITS = datasets.load('digits')
# Real images: their always-black border pixels give exactly zero gradients,
# so Adam's second moment is exactly 0 there (where sqrt has no derivative).
BATCHES = [{'x': _DIGITS.x_train[32 * i:32 * (i + 1)], 'y': _DIGITS.y_train[32 * i:32 * (i + 1)]}
           for i in range(K + 1)]


def loss_after(lr, *, eps_root, guard):
  """The loss on a held-out batch after K steps at peak learning rate ``lr``."""
  task = purax.Task(model=purax.nn.MLP(num_classes=10, features=(8,)), skip_nonfinite=guard,
                    tx=purax.adamw(learning_rate=1e-2, total_steps=K, eps_root=eps_root))
  state = task.init(jax.random.key(0), BATCHES[0])
  state = purax.set_hyperparams(state, learning_rate=lr)
  for batch in BATCHES[:K]:
    state, _ = task.step(state, batch)
  return task.compute_loss(state.params, state.model_state, BATCHES[K], None,
                           hparams=state.hparams, train=False)[0]


@pytest.mark.parametrize('guard', [True, False])
def test_grad_and_jvp_through_k_steps_match_finite_differences(guard):
  lr, h = 1e-2, 1e-4
  f = lambda lr: loss_after(lr, eps_root=1e-8, guard=guard)          # noqa: E731
  jvp = jax.jit(lambda x: jax.jvp(f, (x,), (jnp.float32(1.0),)))   # (loss, d loss / d lr)
  fd = (jvp(jnp.float32(lr + h))[0] - jvp(jnp.float32(lr - h))[0]) / (2 * h)
  _, tangent = jvp(jnp.float32(lr))
  grad = jax.jit(jax.grad(f))(jnp.float32(lr))
  assert np.isfinite(float(grad)) and abs(float(fd)) > 1e-3          # a real slope
  np.testing.assert_allclose(float(grad), float(fd), rtol=1e-3)
  np.testing.assert_allclose(float(grad), -13.399, rtol=1e-3)   # d loss / d lr at lr = 0.01
  np.testing.assert_allclose(float(tangent), float(grad), rtol=1e-6)


def test_without_eps_root_the_meta_gradient_is_nan():
  grad = jax.jit(jax.grad(lambda lr: loss_after(lr, eps_root=0.0, guard=True)))(1e-2)
  assert np.isnan(float(grad))
