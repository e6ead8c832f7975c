"""purax.core.hparams: values are checked where they enter the state (issue
46): another shape or kind of value is refused by name, so the state's
structure and its checkpoints stay what they were."""

import jax
import numpy as np
import pytest

import purax
from purax.io.checkpoint import Checkpointer
from purax.io.checkpoint.run import checkpoint_tree
from tests.helpers import tiny_batch, tiny_task


def test_a_value_of_another_shape_or_kind_is_refused_by_name(tmp_path):
  task, batch = tiny_task('mlp', total_steps=4), tiny_batch()
  state = task.init(jax.random.key(0), batch)
  with pytest.raises(purax.ConfigError, match=r'hyperparameter learning_rate: expected '
                                              r'shape \(\) .*got shape \(3,\)'):
    purax.set_hyperparams(state, learning_rate=np.full(3, 1e-3))
  with pytest.raises(purax.ConfigError, match=r'hyperparameter weight_decay: expected a real '
                                              r'number .*got a value of dtype bool'):
    purax.set_hyperparams(state, weight_decay=True)
  with pytest.raises(purax.ConfigError, match=r'dtype complex'):
    purax.set_hyperparams(state, weight_decay=1j)
  # What is accepted keeps the state's structure: it saves and restores.
  state = purax.set_hyperparams(state, learning_rate=np.float64(3e-4), weight_decay=0)
  state, metrics = jax.jit(task.step)(state, batch)
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, checkpoint_tree(state, metrics))
  restored = purax.restore_or_init(str(tmp_path), task, jax.random.key(1), batch)
  assert float(purax.hyperparams(restored.state)['learning_rate']) == pytest.approx(3e-4)


def test_a_stacked_state_takes_one_value_per_member():
  from purax.core import population as pop_lib
  task, batch = tiny_task('mlp', total_steps=4), tiny_batch()
  keys = jax.vmap(jax.random.key)(np.arange(3))
  pop = pop_lib.init(task, keys, {'learning_rate': np.float32([1e-3, 2e-3, 3e-3])}, batch)
  stacked = pop.state
  purax.set_hyperparams(stacked, learning_rate=np.float32([1e-4, 2e-4, 3e-4]))
  with pytest.raises(purax.ConfigError, match=r'expected shape \(3,\) \(its shape in the '
                                              r'state: one value per member\), got shape \(\)'):
    purax.set_hyperparams(stacked, learning_rate=1e-4)


def test_the_name_before_0_3_still_sets_the_learning_rate_with_a_warning():
  """One name from the flag to the log (issue #45): ``peak_learning_rate``
  (purax before 0.3) sets ``learning_rate``, the same leaf, until 0.4."""
  from purax.core import hparams as hparams_lib
  from purax.core import pbt
  from purax.core import population as pop_lib
  task, batch = tiny_task('mlp', total_steps=4), tiny_batch()
  state = task.init(jax.random.key(0), batch)
  with pytest.warns(DeprecationWarning, match=r"'peak_learning_rate' is deprecated: use "
                                              r"'learning_rate'"):
    old = purax.set_hyperparams(state, peak_learning_rate=3e-4)
  new = purax.set_hyperparams(state, learning_rate=3e-4)
  assert jax.tree.structure(old) == jax.tree.structure(new)
  assert float(purax.hyperparams(old)['learning_rate']) == float(
      purax.hyperparams(new)['learning_rate'])
  assert 'peak_learning_rate' not in hparams_lib.names(old)
  keys = jax.vmap(jax.random.key)(np.arange(2))
  with pytest.warns(DeprecationWarning, match="use 'learning_rate'"):
    pop = pop_lib.init(task, keys, {'peak_learning_rate': np.float32([1e-3, 2e-3])}, batch)
  np.testing.assert_array_equal(purax.hyperparams(pop.state)['learning_rate'],
                                np.float32([1e-3, 2e-3]))
  with pytest.warns(DeprecationWarning, match="use 'learning_rate'"):
    pbt.exploit_explore(pop, np.float32([0.0, 1.0]), key=jax.random.key(0), fraction=0.5,
                        names=('peak_learning_rate',))
