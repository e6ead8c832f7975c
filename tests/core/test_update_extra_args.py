"""optax's extra-args protocol in the step (purax.core.update.extra_args,
objective): ``value``, ``grad`` and ``value_fn`` reach every
``GradientTransformationExtraArgs``, so transformations that read the loss
run in ``Task.step`` as in optax's own loop."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import purax
from purax.core import update
from purax.core.precision import standard_promotion
from tests.helpers import tiny_batch


def linear_regression():
  """A least-squares problem: a linear model on 32 examples of 4 features,
  the Task and optax's own objective of the same batch."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(32, 4)).astype(np.float32)
  batch = {'x': x, 'y': (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)
                         + 0.1 * rng.normal(size=(32, 1)).astype(np.float32))}
  model = purax.Functions(lambda key, x: {'w': jnp.zeros((4, 1)), 'b': jnp.zeros((1, 1))},
                          lambda p, x: x @ p['w'] + p['b'])

  def f(params):                   # optax's loop: the same mean squared error
    return jnp.mean(jnp.square(batch['x'] @ params['w'] + params['b'] - batch['y']))
  return model, batch, f


def test_lbfgs_in_the_step_equals_optaxs_own_loop():
  """optax.lbfgs needs value, grad and value_fn (its zoom line search calls
  value_fn at trial params): 5 steps of Task.step against optax's documented
  loop (``optax.lbfgs`` docstring). Tolerance rtol 1e-5: the same float32
  terms; the step's loss is reduced by purax's loss contract (sum of weighted
  values over the weight), optax's by jnp.mean."""
  model, batch, f = linear_regression()
  tx = optax.lbfgs()
  task = purax.Task(model=model, tx=tx, loss=purax.objectives.regression)
  state = task.init(jax.random.key(0), batch)
  step = jax.jit(task.step)

  @jax.jit
  def optax_step(params, opt_state):
    value, grad = jax.value_and_grad(f)(params)
    updates, opt_state = tx.update(grad, opt_state, params, value=value, grad=grad, value_fn=f)
    return optax.apply_updates(params, updates), opt_state

  params, opt_state = state.params, tx.init(state.params)
  with jax.default_matmul_precision('highest'):
    for _ in range(5):
      state, metrics = step(state, batch)
      params, opt_state = optax_step(params, opt_state)
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert float(f(params)) < 0.02        # it solved the problem (noise 0.1**2 = 0.01)
  assert int(metrics['skipped'].value) == 0


def test_reduce_on_plateau_scales_the_updates_down_after_a_plateau():
  """SGD at 0.1 for 4 steps (the loss improves), then at 0 (a plateau): after
  ``patience`` steps without improvement reduce_on_plateau halves its scale.
  Its scales are those of optax's loop fed the losses the step reported."""
  tx = optax.chain(optax.sgd(optax.piecewise_constant_schedule(0.1, {4: 0.0})),
                   optax.contrib.reduce_on_plateau(factor=0.5, patience=2))
  task = purax.Task(model=purax.nn.MLP(num_classes=3, features=(8,)), tx=tx)
  batch = tiny_batch(n=8, shape=(5,), classes=3)
  state = task.init(jax.random.key(0), batch)
  step = jax.jit(task.step)
  scales, losses = [], []
  for _ in range(9):
    state, metrics = step(state, batch)
    scales.append(float(state.opt_state[1].scale))
    losses.append(metrics['loss'].total / metrics['loss'].count)
  assert scales[:5] == [1.0] * 5 and scales[-1] < 1.0, scales
  plateau = optax.contrib.reduce_on_plateau(factor=0.5, patience=2)
  update = jax.jit(lambda s, value: standard_promotion(plateau.update)(state.params, s,
                                                                       value=value)[1])
  opt_state, expected = plateau.init(state.params), []
  for value in losses:
    opt_state = update(opt_state, value)
    expected.append(float(opt_state.scale))
  assert scales == expected


@pytest.mark.parametrize('microbatches', [1, 2])
def test_the_objective_handed_as_value_fn_is_the_loss_the_gradients_are_of(microbatches):
  """value_fn (update.objective) at the state's params is the step's loss, and
  its gradient is the step's gradients (also accumulated over microbatches)."""
  task = purax.Task(model=purax.nn.MLP(num_classes=3, features=(8,)),
                    tx=optax.sgd(0.1), microbatches=microbatches)
  batch = tiny_batch(n=8, shape=(5,), classes=3, weight=True)
  state = task.init(jax.random.key(1), batch)
  fn = update.objective(task._train_loss, state, batch, settings=task.settings)
  with jax.default_matmul_precision('highest'):
    value, grads = jax.jit(jax.value_and_grad(fn))(state.params)
    expected, metrics, _ = jax.jit(task.gradients)(state, batch)
  loss = float(metrics['loss'].total / metrics['loss'].count)
  np.testing.assert_allclose(float(value), loss, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_plain_transformation_gets_no_keywords_and_purax_adamw_gets_the_norm():
  plain = optax.GradientTransformation(lambda p: optax.EmptyState(),
                                       lambda u, s, p=None: (u, s))
  kwargs = dict(value=1.0, grad={}, value_fn=None, grad_norm=2.0)
  assert update.extra_args(plain, **kwargs) == {}
  assert set(update.extra_args(optax.adam(1e-3), **kwargs)) == {'value', 'grad', 'value_fn'}
  assert update.extra_args(purax.adamw(total_steps=10), **kwargs)['grad_norm'] == 2.0
