"""A checkpoint written before a hyperparameter was renamed restores under its
new name (:func:`purax.io.checkpoint.layout.as_saved`): purax before 0.3
stored the learning rate as ``opt_state.hyperparams['peak_learning_rate']``,
today's state holds ``['learning_rate']`` (issue #45). A real run directory
of 0.1 resumes in ``tests/app/test_old_runs.py``."""

import jax
import numpy as np
import pytest

import purax
from purax.core import hparams as hparams_lib
from purax.io.checkpoint import Checkpointer, CheckpointMismatchError, layout
from tests.helpers import tiny_batch, tiny_task, tree_equal

OLD = {'learning_rate': 'peak_learning_rate'}


def keyless(tree):
  return jax.tree.map(lambda x: jax.random.key_data(x) if layout.is_typed_key(x) else x, tree)


@pytest.fixture(scope='module')
def state():
  task = tiny_task()
  state = task.init(jax.random.key(0), tiny_batch())
  return purax.set_hyperparams(state, learning_rate=3e-4)


def test_a_checkpoint_of_the_old_name_restores_under_the_new_one(tmp_path, state):
  old = hparams_lib.renamed(state, OLD)
  assert 'peak_learning_rate' in hparams_lib.names(old)
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {'state': old})
    ckpt.wait()
    assert any("hyperparams['peak_learning_rate']" in row[0]
               for row in ckpt.read_extra(1)['signature'])
    restored, _, step = ckpt.restore(jax.eval_shape(lambda: {'state': state}))
  assert step == 1
  assert tree_equal(keyless(restored), keyless({'state': state}))
  assert float(purax.hyperparams(restored['state'])['learning_rate']) == np.float32(3e-4)


def test_an_up_to_date_checkpoint_restores_as_it_is(tmp_path, state):
  abstract = jax.eval_shape(lambda: {'state': state})
  saved = layout.signature({'state': state})
  same, back = layout.as_saved(abstract, saved)
  assert same is abstract and back(state) is state
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {'state': state})
    ckpt.wait()
    restored, _, _ = ckpt.restore(abstract)
  assert tree_equal(keyless(restored), keyless({'state': state}))


def test_a_name_neither_spelling_holds_is_still_a_mismatch(tmp_path, state):
  other = hparams_lib.renamed(state, {'learning_rate': 'lr'})
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {'state': other})
    ckpt.wait()
    with pytest.raises(CheckpointMismatchError, match='learning_rate'):
      ckpt.restore(jax.eval_shape(lambda: {'state': state}))
