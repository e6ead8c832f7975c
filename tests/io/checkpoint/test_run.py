"""``purax.restore_or_init``: "nothing here yet" initialises; a path that is
not a checkpoint directory, or a required checkpoint that is missing, is a
named error (issue 28.6), never a silent fresh state."""

import jax
import pytest

import purax
from purax.io.checkpoint import Checkpointer, CheckpointError
from tests.helpers import assert_bitwise, tiny_batch, tiny_task

TASK, BATCH = tiny_task(), tiny_batch()


def restore(path, **kwargs):
  return purax.restore_or_init(str(path), TASK, jax.random.key(0), BATCH, **kwargs)


def test_a_missing_or_empty_directory_initialises_and_must_exist_refuses_it(tmp_path):
  (tmp_path / 'empty').mkdir()
  for path in (tmp_path / 'not yet', tmp_path / 'empty'):
    restored = restore(path)
    assert restored.fresh and restored.step == 0
    with pytest.raises(CheckpointError, match=r'must_exist=True\): expected a committed '
                                              r'checkpoint, got none'):
      restore(path, must_exist=True)
  assert not (tmp_path / 'not yet').exists()          # nothing created where nothing was


def test_a_file_is_a_named_error_not_a_fresh_state(tmp_path):
  data = tmp_path / 'data.npz'
  data.write_bytes(b'not a checkpoint')
  with pytest.raises(purax.ConfigError, match=r"directory: expected a checkpoint directory "
                                              r"or a purax train run directory, got .*data\.npz"
                                              r"', a file"):
    restore(data)


def test_a_directory_of_other_things_is_not_a_checkpoint_directory(tmp_path):
  """E.g. the data directory, or a run directory's parent, passed by mistake."""
  (tmp_path / 'runs').mkdir()
  (tmp_path / 'runs' / 'mine').mkdir()
  (tmp_path / 'runs' / 'notes.txt').write_text('')
  with pytest.raises(purax.ConfigError, match=r"holding \['mine', 'notes.txt'\]"):
    restore(tmp_path / 'runs')


def test_a_checkpoint_directory_restores_its_newest_step(tmp_path):
  state = TASK.init(jax.random.key(1), BATCH)
  state, metrics = TASK.step(state, BATCH)
  with Checkpointer(str(tmp_path / 'ckpt')) as ckpt:
    ckpt.save(1, {'state': state, 'train_metrics': metrics})
  restored = restore(tmp_path / 'ckpt', must_exist=True)
  assert restored.step == 1 and not restored.fresh
  assert_bitwise(restored.state, state)
