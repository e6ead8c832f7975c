"""A frozen subset (optax.multi_transform with optax.set_to_zero, optax.masked
inside) through every purax feature that reads the optimizer state: the
hyperparameter get/set reaches every nested inject_hyperparams, and the
frozen leaves stay bitwise as initialised through a population, PBT and a
resume from a checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import purax
from purax.core import population
from purax.core.hparams import _is_injected

LABELS = {'Dense_0': 'frozen', 'Dense_1': 'body', 'Dense_2': 'head'}
TX = optax.multi_transform({
    'frozen': optax.set_to_zero(),
    'body': optax.chain(
        optax.masked(optax.inject_hyperparams(optax.add_decayed_weights)(weight_decay=1e-3),
                     lambda p: jax.tree.map(lambda x: x.ndim == 2, p)),
        optax.inject_hyperparams(optax.sgd)(learning_rate=1e-2)),
    # an inject_hyperparams inside another one's inner state
    'head': optax.inject_hyperparams(lambda max_norm: optax.chain(
        optax.clip_by_global_norm(max_norm),
        optax.inject_hyperparams(optax.adam)(learning_rate=1e-2)))(max_norm=1.0),
}, lambda params: {k: jax.tree.map(lambda _: v, params[k]) for k, v in LABELS.items()})
TASK = purax.Task(model=purax.nn.MLP(num_classes=3, features=(8, 8)), tx=TX)


def batch(i):
  rng = np.random.default_rng(i)
  return {'x': rng.normal(size=(8, 4)).astype(np.float32),
          'y': rng.integers(0, 3, 8).astype(np.int32)}


def injected(opt_state):
  """Every inject_hyperparams state, at any depth (inside another one's too)."""
  found = []
  for x in jax.tree.leaves(opt_state, is_leaf=_is_injected):
    if _is_injected(x):
      found += [x] + injected(x.inner_state)
  return found


def test_get_and_set_reach_every_nested_inject_hyperparams():
  state = jax.jit(TASK.init)(jax.random.key(0), batch(0))
  # under multi_transform, chain, masked and another inject_hyperparams
  assert len(injected(state.opt_state)) == 4
  assert {'learning_rate', 'weight_decay', 'max_norm', 'b1'} <= set(purax.hyperparams(state))
  state = purax.set_hyperparams(state, learning_rate=0.5, weight_decay=0.25, max_norm=2.0)
  values = [(name, float(v)) for node in injected(state.opt_state)
            for name, v in node.hyperparams.items()
            if name in ('learning_rate', 'weight_decay', 'max_norm')]
  assert sorted(values) == [('learning_rate', 0.5), ('learning_rate', 0.5), ('max_norm', 2.0),
                            ('weight_decay', 0.25)]
  assert float(purax.hyperparams(state)['learning_rate']) == 0.5


def test_frozen_leaves_stay_bitwise_through_a_population_pbt_and_a_resume(tmp_path):
  """Two members of one initialisation (a shared pretrained backbone), their
  learning rates reaching both trained subsets, PBT copying one into the
  other every 2 steps, a checkpoint at step 3 restored and trained on to 6."""
  lrs = jnp.float32([1e-3, 3e-2])
  keys = jax.vmap(jax.random.key)(jnp.zeros(2, jnp.int32))
  pop = jax.jit(population.init, static_argnums=0)(TASK, keys, {'learning_rate': lrs}, batch(0))
  frozen = jax.tree.map(np.array, pop.state.params['Dense_0'])
  before = {k: np.array(pop.state.params[k]['kernel']) for k in ('Dense_1', 'Dense_2')}
  for node in injected(pop.state.opt_state):
    if 'learning_rate' in node.hyperparams:
      np.testing.assert_array_equal(node.hyperparams['learning_rate'], lrs)
  data = [batch(i) for i in range(6)]
  plan = purax.plan.PopulationPlan(TASK)

  def hooks(ckpt):
    return purax.hooks.standard(log_every=2, progress=False, eval_data=[batch(99)],
                                eval_every=2, checkpointer=ckpt, max_consecutive_skips=None) + [
        purax.hooks.PBT(every=2, fraction=0.5, names=('learning_rate',),
                        key=jax.random.key(7))]

  with purax.Checkpointer(str(tmp_path)) as ckpt:
    pop, history = purax.fit(TASK, pop, data, steps=3, plan=plan, hooks=hooks(ckpt))
  assert any('pbt/source' in r for r in history)
  window = jax.eval_shape(lambda p, b: population.step(TASK, p, b)[1], pop, data[0])
  with purax.Checkpointer(str(tmp_path)) as ckpt:
    tree, _, step = ckpt.restore(jax.eval_shape(lambda: {'state': pop, 'train_metrics': window}))
    assert step == 3
    restored = purax.io.checkpoint.run.Restored(tree['state'], tree['train_metrics'], step,
                                                None, {})
    pop, _ = purax.fit(TASK, restored, data, plan=plan, hooks=hooks(ckpt))
  assert int(np.max(pop.state.step)) == 6
  for got, want in zip(jax.tree.leaves(pop.state.params['Dense_0']), jax.tree.leaves(frozen)):
    np.testing.assert_array_equal(got, want)          # bit for bit, every member
  for name, kernel in before.items():                 # the trained subsets did move
    assert np.all(np.any(np.asarray(pop.state.params[name]['kernel']) != kernel, axis=(1, 2)))
