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
  with pytest.raises(purax.ConfigError, match=r'hyperparameter peak_learning_rate: expected '
                                              r'shape \(\) .*got shape \(3,\)'):
    purax.set_hyperparams(state, peak_learning_rate=np.full(3, 1e-3))
  with pytest.raises(purax.ConfigError, match=r'hyperparameter weight_decay: expected a real '
                                              r'number .*got a value of dtype bool'):
    purax.set_hyperparams(state, weight_decay=True)
  with pytest.raises(purax.ConfigError, match=r'dtype complex'):
    purax.set_hyperparams(state, weight_decay=1j)
  # What is accepted keeps the state's structure: it saves and restores.
  state = purax.set_hyperparams(state, peak_learning_rate=np.float64(3e-4), weight_decay=0)
  state, metrics = jax.jit(task.step)(state, batch)
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, checkpoint_tree(state, metrics))
  restored = purax.restore_or_init(str(tmp_path), task, jax.random.key(1), batch)
  assert float(purax.hyperparams(restored.state)['peak_learning_rate']) == pytest.approx(3e-4)


def test_a_stacked_state_takes_one_value_per_member():
  from purax.core import population as pop_lib
  task, batch = tiny_task('mlp', total_steps=4), tiny_batch()
  keys = jax.vmap(jax.random.key)(np.arange(3))
  pop = pop_lib.init(task, keys, {'peak_learning_rate': np.float32([1e-3, 2e-3, 3e-3])}, batch)
  stacked = pop.state
  purax.set_hyperparams(stacked, peak_learning_rate=np.float32([1e-4, 2e-4, 3e-4]))
  with pytest.raises(purax.ConfigError, match=r'expected shape \(3,\) \(its shape in the '
                                              r'state: one value per member\), got shape \(\)'):
    purax.set_hyperparams(stacked, peak_learning_rate=1e-4)
