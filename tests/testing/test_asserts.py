"""purax.testing.asserts: the assertions fail, naming the leaf, when a step
is not the single-device step (the strategies: test_strategies.py)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import purax
from purax import parallel, testing
from tests.helpers import compilations


@settings(max_examples=5)
@given(tree=testing.small_pytrees())
def test_assert_trees_close_accepts_equal_rejects_perturbed(tree):
  testing.assert_trees_close(tree, dict(tree), testing.TOLERANCES['params'])
  name = sorted(tree)[0]
  bad = dict(tree, **{name: tree[name] + np.float32(1e-3)})
  with pytest.raises(AssertionError, match=rf"\['{name}'\]: max \|actual - expected\|"):
    testing.assert_trees_close(bad, tree, testing.TOLERANCES['params'], what='tree')


def test_assert_trees_close_checks_structure_shape_dtype():
  with pytest.raises(AssertionError, match='structure'):
    testing.assert_trees_close({'a': 1.0}, {'b': 1.0}, testing.TOLERANCES['loss'])
  with pytest.raises(AssertionError, match='shape'):
    testing.assert_trees_close({'a': np.zeros(2)}, {'a': np.zeros(3)}, testing.TOLERANCES['loss'])
  with pytest.raises(AssertionError, match='dtype'):
    testing.assert_trees_close({'a': np.zeros(2, np.float32)}, {'a': np.zeros(2)},
                               testing.TOLERANCES['loss'])


@purax.loss_function(hparams={'label_smoothing': 0.0})
def _first_half_loss(outputs, batch, hparams):
  """Drops the second half of the batch: right on one device, wrong when split."""
  values, _, metrics = purax.objectives.classification(outputs, batch, hparams)
  n = values.shape[0]
  return values, (np.arange(n) < n // 2).astype(np.float32), metrics


def test_assert_step_matches_single_device_catches_a_wrong_step():
  """The sharded run of the right task matches; a wrong sharded step is caught."""
  task = purax.Task(model=purax.nn.MLP(num_classes=4, features=(8,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=10))
  rng = np.random.default_rng(0)
  batches = [{'x': rng.normal(size=(8, 4)).astype(np.float32),
              'y': rng.integers(0, 4, 8).astype(np.int32)}]
  mesh = parallel.make_mesh(data=8)
  with jax.default_matmul_precision('highest'):
    testing.assert_step_matches_single_device(task, mesh, parallel.data_parallel(), batches)
    state = jax.jit(task.init)(jax.random.key(0), batches[0])
    broken = parallel.shard_map_step(
        purax.Task(model=task.model, tx=task.tx, loss=_first_half_loss), mesh)
    with pytest.raises(AssertionError, match='step 1 loss sum'):
      testing.assert_same_training(jax.jit(task.step), jax.tree.map(jax.numpy.copy, state),
                                   broken, state, batches)


def test_the_step_is_traced_once_and_compiled_once_per_mesh():
  """Issue 32: the model, loss and optimizer are traced once per (task, batch
  shapes) for every mesh and rules; a (mesh, rules, shapes) case drawn again
  (other batch values, as a property test's next example) compiles nothing."""
  traced = []

  @purax.loss_function(hparams={'label_smoothing': 0.0})
  def counted_loss(outputs, batch, hparams):
    traced.append(1)
    return purax.objectives.classification(outputs, batch, hparams)

  task = purax.Task(model=purax.nn.MLP(num_classes=4, features=(8,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=10), loss=counted_loss)
  rng = np.random.default_rng(1)
  draw = lambda: [{'x': rng.normal(size=(8, 4)).astype(np.float32),  # noqa: E731
                   'y': rng.integers(0, 4, 8).astype(np.int32)} for _ in range(2)]
  cases = [(testing.mesh_of({'data': n}), parallel.data_parallel()) for n in (2, 4)] + [
      (testing.mesh_of({'data': 1, 'fsdp': 4}), parallel.fsdp(16))]
  with jax.default_matmul_precision('highest'):
    testing.assert_step_matches_single_device(task, *cases[0], draw())
    once = len(traced)
    for mesh, rules in cases[1:]:
      testing.assert_step_matches_single_device(task, mesh, rules, draw())
    assert len(traced) == once, 'the step was traced again for another mesh'
    with compilations() as compiled:      # compiles, and loads from the suite's cache
      for mesh, rules in cases:
        testing.assert_step_matches_single_device(task, mesh, rules, draw())
    assert compiled == [], 'a case drawn again compiled a program'
  assert once > 0


# -- every leaf type, any state pytree (issue: assertions over every leaf type) --

def _mixed_tree(key_seed=0):
  return {'key': jax.random.key(key_seed), 'bf16': jnp.ones((3,), jnp.bfloat16),
          'int': jnp.arange(3, dtype=jnp.int32), 'bool': jnp.array([True, False]),
          'none': None, 'f32': jnp.zeros((2,), jnp.float32)}


def test_assert_trees_close_handles_keys_bf16_ints_bools_and_none():
  tol = testing.TOLERANCES['params']
  testing.assert_trees_close(_mixed_tree(), _mixed_tree(), tol)          # itself: no error
  with pytest.raises(AssertionError, match=r"tree\['key'\]: PRNG key data"):
    testing.assert_trees_close(_mixed_tree(1), _mixed_tree(0), tol)
  changed = dict(_mixed_tree(), int=jnp.array([0, 1, 5], jnp.int32))
  with pytest.raises(AssertionError, match=r"tree\['int'\]: int32 values differ at \[\[2\]\]"):
    testing.assert_trees_close(changed, _mixed_tree(), tol)
  changed = dict(_mixed_tree(), bool=jnp.array([True, True]))
  with pytest.raises(AssertionError, match=r"tree\['bool'\]: bool values differ"):
    testing.assert_trees_close(changed, _mixed_tree(), tol)
  changed = dict(_mixed_tree(), bf16=jnp.full((3,), 1.5, jnp.bfloat16))
  with pytest.raises(AssertionError, match=r"tree\['bf16'\]: max \|actual - expected\| = 0.5"):
    testing.assert_trees_close(changed, _mixed_tree(), tol)
  with pytest.raises(AssertionError, match='structure'):
    testing.assert_trees_close(dict(_mixed_tree(), none=jnp.zeros(())), _mixed_tree(), tol)
  other_impl = dict(_mixed_tree(), key=jax.random.key(0, impl='rbg'))
  with pytest.raises(AssertionError, match="key implementation|shape"):
    testing.assert_trees_close(other_impl, _mixed_tree(), tol)


@pytest.mark.dtype_promotion('standard')   # flax's TrainState and optax, called here directly
def test_assert_same_training_takes_a_flax_train_state_step():
  from flax.training import train_state
  import optax
  model = purax.nn.MLP(num_classes=3, features=(8,))
  x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
  y = np.arange(8, dtype=np.int32) % 3
  params = model.init(jax.random.key(0), x, train=False)['params']
  make = lambda: train_state.TrainState.create(apply_fn=model.apply, params=params,
                                               tx=optax.adam(1e-2))

  def step(state, batch):
    def loss(p):
      logits = state.apply_fn({'params': p}, batch['x'], train=False)
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch['y']).mean()
    value, grads = jax.value_and_grad(loss)(state.params)
    return state.apply_gradients(grads=grads), {'loss': value}

  batches = [{'x': x, 'y': y}] * 3
  testing.assert_same_training(jax.jit(step), make(), step, make(), batches)

  def wrong(state, batch):               # a different learning rate: caught, named
    new, m = step(state, batch)
    return new.replace(params=jax.tree.map(lambda p: p * 1.01, new.params)), m

  with pytest.raises(AssertionError, match=r'step 1 state\.params\['):
    testing.assert_same_training(step, make(), wrong, make(), batches)


def test_a_changed_rng_is_reported_with_its_path():
  task = purax.Task(model=purax.nn.MLP(num_classes=4, features=(8,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=10))
  batch = {'x': np.ones((8, 4), np.float32), 'y': np.zeros(8, np.int32)}
  step = jax.jit(task.step)

  def reseeding(state, b):
    new, m = step(state, b)
    return new.replace(rng=jax.random.fold_in(new.rng, 1)), m

  state = task.init(jax.random.key(0), batch)
  with pytest.raises(AssertionError, match=r'step 1 state\.rng: PRNG key data'):
    testing.assert_same_training(step, state, reseeding, state, [batch])


def test_learning_rate_widening_is_opt_in_and_gradients_stay_tight():
  """With learning_rate='auto' the params tolerance grows by 2 lr per step; a
  wrong gradient is still caught by the gradient comparison."""
  task = purax.Task(model=purax.nn.MLP(num_classes=4, features=(8,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=10))
  state = task.init(jax.random.key(0), {'x': np.ones((8, 4), np.float32),
                                        'y': np.zeros(8, np.int32)})
  assert testing.learning_rate_of(state) == pytest.approx(1e-2)


def test_resync_compares_each_step_from_the_same_state():
  """Two runs that drift apart slowly: resync compares every step on its own."""
  task = purax.Task(model=purax.nn.MLP(num_classes=4, features=(8,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=10))
  batch = {'x': np.ones((8, 4), np.float32), 'y': np.zeros(8, np.int32)}
  step = jax.jit(task.step)

  def drifting(state, b):       # a tiny error each step, compounding over steps
    new, m = step(state, b)
    return new.replace(params=jax.tree.map(lambda p: p + 4e-6, new.params)), m

  state = task.init(jax.random.key(0), batch)
  copy = lambda: jax.tree.map(jnp.copy, state)
  with pytest.raises(AssertionError, match=r'step [2-9] '):
    testing.assert_same_training(step, copy(), drifting, copy(), [batch] * 6)
  testing.assert_same_training(step, copy(), drifting, copy(), [batch] * 6, resync=True)


# -- built on chex, extended where chex falls short --

def test_chex_cannot_read_typed_keys_so_purax_compares_their_data():
  """The extension is needed: chex raises a TypeError on a typed key; purax
  compares implementation and key data, and names the leaf."""
  import chex
  with pytest.raises(TypeError):
    chex.assert_trees_all_close({'k': jax.random.key(0)}, {'k': jax.random.key(0)})
  testing.assert_trees_close({'k': jax.random.key(3)}, {'k': jax.random.key(3)},
                             testing.TOLERANCES['params'])


def test_failures_carry_chex_report_under_the_leaf_path():
  tol = testing.TOLERANCES['params']
  with pytest.raises(AssertionError, match=r"(?s)state\['w'\]: max .*\[Chex\] Assertion "
                                           r"assert_trees_all_close failed"):
    testing.assert_trees_close({'w': np.zeros(2, np.float32)}, {'w': np.ones(2, np.float32)},
                               tol, what='state')


def test_assert_finite_skips_keys_and_names_the_bad_leaf():
  testing.assert_finite(_mixed_tree())
  bad = dict(_mixed_tree(), bf16=jnp.array([1.0, jnp.nan, 0.0], jnp.bfloat16))
  with pytest.raises(AssertionError, match=r"(?s)state: non-finite values.*'bf16'"):
    testing.assert_finite(bad, what='state')


def test_two_runs_that_diverge_alike_are_not_called_equal():
  """NaN equals NaN leaf by leaf; the reference run must stay finite."""
  def nan_step(state, batch):
    return jax.tree.map(lambda x: x * jnp.nan, state), {}

  state = {'w': jnp.ones((2,), jnp.float32)}
  with pytest.raises(AssertionError, match='step 1 reference state: non-finite'):
    testing.assert_same_training(nan_step, state, nan_step, state, [{}])
