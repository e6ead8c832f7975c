"""The weight-decay mask of purax.adamw (matrices only by default) and the
optimizers of purax.core.optimizers: injected hyperparameters, each equal to
the optax transformation it wraps."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import purax
from purax.core import optim, optimizers, precision

PARAMS = {'dense': {'kernel': jnp.full((3, 4), 2.0), 'bias': jnp.full((4,), 2.0)},
          'norm': {'scale': jnp.full((4,), 2.0)},
          'layers': {'kernel': jnp.full((2, 4, 4), 2.0), 'scale': jnp.full((2, 4), 2.0)}}
ZERO = jax.tree.map(jnp.zeros_like, PARAMS)


def decayed(tx):
  """The leaves one update of zero gradients moves (only weight decay moves them)."""
  updates, _ = tx.update(ZERO, tx.init(PARAMS), PARAMS)
  return {jax.tree_util.keystr(p) for p, u in jax.tree_util.tree_flatten_with_path(updates)[0]
          if np.any(np.asarray(u) != 0)}


MATRICES = {"['dense']['kernel']", "['layers']['kernel']"}


@pytest.mark.parametrize('build', [
    lambda **kw: purax.adamw(total_steps=10, weight_decay=0.1, **kw),
    lambda **kw: optimizers.sgd(total_steps=10, weight_decay=0.1, **kw),
    lambda **kw: optimizers.schedule_free_adamw(weight_decay=0.1, **kw),
    lambda **kw: optimizers.muon(total_steps=10, weight_decay=0.1, **kw),
], ids=['adamw', 'sgd', 'schedule_free_adamw', 'muon'])
def test_weight_decay_reaches_the_matrices_by_default_and_every_leaf_without_a_mask(build):
  """Matrices only (ndim >= 2; a stacked 'layers' axis not counted): no bias,
  no norm scale, no stacked scale [layers, d]; mask None: every leaf."""
  assert decayed(build()) == MATRICES
  assert decayed(build(weight_decay_mask=None)) == {
      jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(PARAMS)[0]}
  only_bias = {'dense': {'kernel': False, 'bias': True}, 'norm': False, 'layers': False}
  assert decayed(build(weight_decay_mask=only_bias)) == {"['dense']['bias']"}


def test_adamw_without_a_mask_is_bitwise_the_adamw_purax_trained_with_before():
  """weight_decay_mask=None is the purax.adamw of before the option (its code
  as it was, at commit 51aee0f): the same updates, bit for bit."""
  def before(learning_rate, weight_decay, b1, b2, eps, clip_norm, *, warmup_steps,
             total_steps, eps_root):
    schedule = optim.warmup_cosine(learning_rate, warmup_steps=warmup_steps,
                                   total_steps=total_steps)
    return optax.chain(optim.clip_by_global_norm(clip_norm, use_given_norm=True),
                       optax.adamw(schedule, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                                   weight_decay=weight_decay, mu_dtype=jnp.float32))
  theirs = optax.inject_hyperparams(before, static_args=('warmup_steps', 'total_steps',
                                                         'eps_root'),
                                    hyperparam_dtype=jnp.float32)(
      learning_rate=1e-2, weight_decay=0.1, b1=0.9, b2=0.999, eps=1e-8, clip_norm=0.5,
      warmup_steps=2, total_steps=10, eps_root=0.0)
  ours = purax.adamw(learning_rate=1e-2, total_steps=10, warmup_steps=2, weight_decay=0.1,
                     clip_norm=0.5, weight_decay_mask=None)
  grads = jax.tree.map(lambda p: 0.3 * p - 0.1, PARAMS)
  s1, s2 = ours.init(PARAMS), theirs.init(PARAMS)
  assert jax.tree.structure(s1) == jax.tree.structure(s2)    # old checkpoints restore
  for _ in range(3):
    u1, s1 = jax.jit(ours.update)(grads, s1, PARAMS)
    u2, s2 = jax.jit(precision.standard_promotion(theirs.update))(grads, s2, PARAMS)
    for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
      np.testing.assert_array_equal(a, b)


def test_muon_is_optax_muon_with_its_hyperparameters_injected():
  """The same updates as optax.contrib.muon at the same (constant) learning
  rate, to rtol 1e-5 / atol 1e-6 (updates ~1e-2): purax injects the
  hyperparameters as float32 arrays where optax computes with the Python
  floats (Adam's bias correction ``1 - b**t``, Muon's ``beta``), and the
  Newton-Schulz iterations carry that last-ulp difference to ~1e-7."""
  params = {'w': jnp.arange(12.0).reshape(3, 4) / 10, 'b': jnp.ones(4)}
  grads = jax.tree.map(lambda p: jnp.sin(p) + 0.1, params)
  ours = optimizers.muon(learning_rate=0.02, total_steps=10**6, momentum=0.9, clip_norm=1e30,
                         weight_decay=0.01)
  theirs = optax.contrib.muon(0.02 * optim.warmup_cosine(1.0, warmup_steps=0,
                                                          total_steps=10**6)(0),
                              beta=0.9, weight_decay=0.01, mu_dtype=jnp.float32)
  s1, s2 = ours.init(params), theirs.init(params)
  assert sorted(s1.hyperparams) == ['b1', 'b2', 'clip_norm', 'eps', 'learning_rate',
                                    'momentum', 'weight_decay']
  u1, _ = jax.jit(ours.update)(grads, s1, params)
  u2, _ = jax.jit(precision.standard_promotion(theirs.update))(grads, s2, params)
  for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('build, field', [
    (lambda: optimizers.sgd(total_steps=10, momentum=1.0), 'momentum'),
    (lambda: optimizers.muon(total_steps=10, weight_decay_mask='matrices'),
     'weight_decay_mask'),
    (lambda: optimizers.muon(total_steps=10, muon_leaves={'w': 'muon'}), r"muon_leaves\['w'\]"),
    (lambda: optimizers.schedule_free_adamw(b1=0.0), 'b1'),
    (lambda: purax.adamw(total_steps=10, weight_decay_mask='matrices'), 'weight_decay_mask'),
    (lambda: optimizers.sgd(total_steps=0), 'total_steps'),
])
def test_bad_values_name_the_field(build, field):
  with pytest.raises(purax.ConfigError, match=f'^{field}: expected'):
    build()


def test_schedule_free_eval_params_finds_the_state_at_any_depth_and_names_its_absence():
  task = purax.Task(model=purax.nn.MLP(num_classes=3, features=(4,)),
                    tx=optimizers.schedule_free_adamw(warmup_steps=2),
                    eval_params=optimizers.schedule_free_eval_params)
  batch = {'x': np.ones((2, 5), np.float32), 'y': np.zeros(2, np.int32)}
  state, _ = jax.jit(task.step)(task.init(jax.random.key(0), batch), batch)
  (sf,) = [x for x in jax.tree.leaves(state.opt_state, is_leaf=lambda x: isinstance(
      x, optax.contrib.ScheduleFreeState)) if isinstance(x, optax.contrib.ScheduleFreeState)]
  expected = optax.contrib.schedule_free_eval_params(sf, state.params)
  for a, b in zip(jax.tree.leaves(task.evaluation_params(state)), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(a, b)
  # In a multi_transform subset: the other subset's leaves are their params.
  tx = optax.multi_transform({'sf': optax.contrib.schedule_free_adamw(1e-2),
                              'frozen': optax.set_to_zero()},
                             lambda p: {k: jax.tree.map(lambda _: 'frozen' if k == 'Dense_0'
                                                        else 'sf', v) for k, v in p.items()})
  task = purax.Task(model=task.model, tx=tx, eval_params=optimizers.schedule_free_eval_params)
  state, _ = jax.jit(task.step)(task.init(jax.random.key(0), batch), batch)
  x = task.evaluation_params(state)
  for a, b in zip(jax.tree.leaves(x['Dense_0']), jax.tree.leaves(state.params['Dense_0'])):
    np.testing.assert_array_equal(a, b)
  (sf,) = [s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda s: isinstance(
      s, optax.contrib.ScheduleFreeState)) if isinstance(s, optax.contrib.ScheduleFreeState)]
  np.testing.assert_array_equal(x['Dense_1']['kernel'], optax.contrib.schedule_free_eval_params(
      sf._replace(z=sf.z['Dense_1']), state.params['Dense_1'])['kernel'])
  with pytest.raises(purax.ConfigError, match='state.opt_state: expected one optax.contrib'):
    optimizers.schedule_free_eval_params(purax.Task(
        model=task.model, tx=optax.sgd(0.1)).init(jax.random.key(0), batch))
