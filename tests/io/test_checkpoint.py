"""io.checkpoint: strict restore, keep-last/best, skipping unreadable checkpoints,
failing saves that leave earlier checkpoints intact."""

import contextlib
import errno
import gc
import glob
import os
import subprocess

import jax
import numpy as np
import pytest

from purax.io.checkpoint import Checkpointer, CheckpointError, CheckpointMismatchError
from tests.helpers import tiny_batch, tiny_task, tree_equal


def keyless(tree):
  return jax.tree.map(lambda x: jax.random.key_data(x)
                      if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x, tree)


@pytest.fixture(scope='module')
def trained():
  task = tiny_task('resnet')
  batch = tiny_batch()
  state = task.init(jax.random.key(0), batch)
  step = jax.jit(task.step, donate_argnums=0)
  states = []
  for _ in range(4):
    state, _ = step(state, batch)
    states.append(jax.tree.map(np.asarray, keyless(state)))
  return task, batch, state, states


def test_save_restore_round_trip_with_typed_keys_and_donation(tmp_path, trained):
  task, batch, state, _ = trained
  with Checkpointer(str(tmp_path), metadata={'config': {'lr': 1}}) as ckpt:
    ckpt.save(4, {'state': state})
    # The saved arrays may be donated right after save() returns.
    jax.jit(task.step, donate_argnums=0)(jax.tree.map(lambda x: x.copy(), state), batch)
    ckpt.wait()
    restored, extra, step = ckpt.restore(jax.eval_shape(lambda: {'state': state}))
  assert step == 4 and extra['data'] == {'next_step': 4} and extra['config'] == {'lr': 1}
  assert jax.dtypes.issubdtype(restored['state'].rng.dtype, jax.dtypes.prng_key)
  assert tree_equal(keyless(restored), keyless({'state': state}))


def test_keeps_the_last_n_and_the_best_k(tmp_path, trained):
  _, _, state, _ = trained
  with Checkpointer(str(tmp_path), keep_last=2, keep_best=1) as ckpt:
    for step, acc in zip(range(1, 6), [0.1, 0.9, 0.2, 0.3, 0.4]):
      ckpt.save(step, {'state': state}, metrics={'eval/accuracy': acc})
      ckpt.wait()
    assert ckpt.steps() == [2, 4, 5]


def test_a_different_model_is_a_clear_error_naming_the_first_differing_path(tmp_path, trained):
  _, _, state, _ = trained
  other = tiny_task('resnet', classes=7).init(jax.random.key(0), tiny_batch(classes=7))
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {'state': state})
    ckpt.wait()
    with pytest.raises(CheckpointMismatchError,
                       match=r"\['state'\]\.params\['Dense_0'\]\['bias'\]: expected "
                             r"float32\[7\] \(the current model\), got float32\[10\]"):
      ckpt.restore(jax.eval_shape(lambda: {'state': other}))
    mlp = tiny_task('mlp').init(jax.random.key(0), tiny_batch())
    with pytest.raises(CheckpointMismatchError, match='expected in the checkpoint'):
      ckpt.restore(jax.eval_shape(lambda: {'state': mlp}))


@pytest.mark.parametrize('damage', ['truncate_arrays', 'truncate_json', 'delete_metadata'])
def test_an_unreadable_newest_checkpoint_is_skipped_with_a_warning(tmp_path, trained, damage):
  _, _, state, _ = trained
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {'state': state})
    ckpt.save(2, {'state': jax.tree.map(lambda x: x, state).replace(step=state.step + 100)})
    ckpt.wait()
  files = [f for f in glob.glob(f'{tmp_path}/2/**', recursive=True) if os.path.isfile(f)]
  if damage == 'truncate_arrays':
    targets = [f for f in files if '/state/' in f and os.path.getsize(f) > 64]
  elif damage == 'truncate_json':
    targets = [f for f in files if '/extra/' in f]
  else:
    targets = [f for f in files if os.path.basename(f).startswith('_')]
  assert targets
  for f in targets:
    if damage == 'delete_metadata':
      os.remove(f)
    else:
      with open(f, 'r+b') as fh:
        fh.truncate(os.path.getsize(f) // 3)
  with Checkpointer(str(tmp_path)) as ckpt:
    with pytest.warns(RuntimeWarning, match='skipping unreadable checkpoint 2'):
      restored, _, step = ckpt.restore(jax.eval_shape(lambda: {'state': state}))
  assert step == 1 and int(restored['state'].step) == int(state.step)


@pytest.fixture
def small_disk(tmp_path):
  """A 512 KiB tmpfs, so that a save really runs out of space (needs root)."""
  mount = tmp_path / 'disk'
  mount.mkdir()
  done = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=512k', 'tmpfs', str(mount)],
                        capture_output=True)
  if done.returncode != 0:
    pytest.skip(f'cannot mount a tmpfs here: {done.stderr.decode().strip()}')
  yield mount
  subprocess.run(['umount', '-l', str(mount)], check=False)


def fill(directory):
  fd = os.open(directory / 'filler', os.O_WRONLY | os.O_CREAT)
  try:
    while True:
      os.write(fd, b'0' * 4096)
  except OSError as e:
    assert e.errno == errno.ENOSPC
  finally:
    os.close(fd)


# A failed orbax background save leaves coroutines whose event loop has closed;
# they are reported as unraisable when collected. That noise is orbax's.
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
@pytest.mark.parametrize('async_save', [True, False])
def test_a_save_that_runs_out_of_space_raises_and_leaves_earlier_checkpoints_intact(
    small_disk, trained, async_save):
  _, _, state, _ = trained
  ckpt = Checkpointer(str(small_disk / 'ckpt'), async_save=async_save)
  ckpt.save(1, {'state': state})
  ckpt.wait()
  fill(small_disk)
  with pytest.raises(CheckpointError, match=r'checkpoint.* in .*ckpt.* failed: OSError: '
                                            r'\[Errno 28\] No space left on device'):
    ckpt.save(2, {'state': state})
    ckpt.wait()
  with contextlib.suppress(CheckpointError):
    ckpt.close()   # while the disk is still full: the failed save stays uncommitted
  del ckpt
  gc.collect()   # let orbax's orphaned coroutines be reported here, under the filter
  os.remove(small_disk / 'filler')
  restored, _, step = Checkpointer(str(small_disk / 'ckpt')).restore(
      jax.eval_shape(lambda: {'state': state}))
  assert step == 1 and tree_equal(keyless(restored), keyless({'state': state}))


def test_no_checkpoint_and_unwritable_directory(tmp_path, trained):
  _, _, state, _ = trained
  with pytest.raises(CheckpointError, match='expected a committed checkpoint, got none'):
    Checkpointer(str(tmp_path / 'empty')).restore(jax.eval_shape(lambda: {'state': state}))
  (tmp_path / 'file').write_text('x')
  with pytest.raises(CheckpointError, match='expected writable'):
    Checkpointer(str(tmp_path / 'file' / 'ckpt'))
