"""purax.io.checkpoint.manager (the Checkpointer): strict restore,
keep-last/best, skipping unreadable checkpoints, failing saves that leave
earlier checkpoints intact."""

import contextlib
import errno
import gc
import glob
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest

import purax
from purax.io.checkpoint import manager
from purax.io.checkpoint import Checkpointer, CheckpointError, CheckpointMismatchError
from tests.helpers import compilations, tiny_batch, tiny_task, tree_equal
from tests.helpers_checkpoint import CORRUPTIONS, HARMLESS, tmpfs


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


@pytest.mark.parametrize('metric, mode, values, best', [
    ('eval/accuracy', 'max', [0.1, 0.9, 0.2, 0.3, 0.4], 2),
    ('eval/loss', 'min', [0.9, 0.1, 0.8, float('nan'), 0.7], 2),     # NaN never the best
    ('train/loss', 'max', [0.9, 0.1, 1.5, 0.3, 0.2], 3),             # any metric, any mode
])
def test_keeps_the_last_n_and_the_best_k(tmp_path, trained, metric, mode, values, best):
  _, _, state, _ = trained
  with Checkpointer(str(tmp_path), keep_last=2, keep_best=1, best_metric=metric,
                    best_mode=mode) as ckpt:
    for step, value in zip(range(1, 6), values):
      ckpt.save(step, {'state': state}, metrics={metric: value, 'other/metric': -step})
      ckpt.wait()
    assert ckpt.steps() == sorted({best, 4, 5})


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


@pytest.fixture(scope='module')
def two_checkpoints(tmp_path_factory):
  """Checkpoints 1 and 2 (different states) of an MLP, written once. Its first
  kernel and that kernel's Adam moments (1.2 MiB each) are stored from device
  arrays (with orbax's array metadata); the other leaves from host copies."""
  task = purax.Task(model=purax.nn.MLP(num_classes=10, features=(4608,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=100, warmup_steps=0))
  batch = tiny_batch()
  state = task.init(jax.random.key(0), batch)
  later = jax.jit(task.step)(state, batch)[0]
  directory = tmp_path_factory.mktemp('pristine')
  with Checkpointer(str(directory)) as ckpt:
    ckpt.save(1, {'state': state})
    ckpt.save(2, {'state': later})
  return directory, state, later


# orbax's failed reads leave coroutines that are reported when collected: orbax's noise.
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
@pytest.mark.parametrize('damage', sorted(CORRUPTIONS))
def test_an_unreadable_newest_checkpoint_is_moved_aside_and_the_older_one_restored(
    tmp_path, two_checkpoints, damage):
  pristine, state, later = two_checkpoints
  directory = tmp_path / 'ckpt'
  shutil.copytree(pristine, directory)
  CORRUPTIONS[damage](str(directory / '2'))
  abstract = jax.eval_shape(lambda: {'state': state})
  with Checkpointer(str(directory)) as ckpt:
    with pytest.warns(RuntimeWarning, match=r'skipping unreadable checkpoint 2 .*moved to '
                                            r'.*2\.unreadable-1'):
      restored, _, step = ckpt.restore(abstract, move_aside=True)
    assert step == 1 and tree_equal(keyless(restored), keyless({'state': state}))
    assert ckpt.steps() == [1]
    assert (directory / '2.unreadable-1').is_dir()     # kept for inspection
    ckpt.save(2, {'state': later})                     # the step can be saved again
    ckpt.wait()
    assert ckpt.steps() == [1, 2]
  restored, _, step = Checkpointer(str(directory)).restore(abstract)
  assert step == 2 and tree_equal(keyless(restored), keyless({'state': later}))


def test_verify_false_waives_the_required_integrity_records(tmp_path, two_checkpoints):
  """What ``verify=False`` waives: a checkpoint without its records restores as
  stored (the records' tests above show the default refuses it)."""
  pristine, state, later = two_checkpoints
  shutil.copytree(pristine, tmp_path / 'ckpt')
  for key in ('fingerprints', 'signature', 'sha256'):     # sha256 last: none left
    CORRUPTIONS[f'removed {key} record' if key == 'sha256' else f'removed {key}, resealed'](
        str(tmp_path / 'ckpt' / '2'))
  abstract = jax.eval_shape(lambda: {'state': state})
  with pytest.raises(CheckpointError, match=r'checkpoint 2 .*unreadable.*integrity records'):
    Checkpointer(str(tmp_path / 'ckpt')).restore(abstract, step=2)
  restored, _, step = Checkpointer(str(tmp_path / 'ckpt'), verify=False).restore(abstract)
  assert step == 2 and tree_equal(keyless(restored), keyless({'state': later}))


@pytest.mark.parametrize('damage', sorted(HARMLESS))
def test_damage_to_files_restore_does_not_read_keeps_the_verified_checkpoint(
    tmp_path, two_checkpoints, damage):
  pristine, state, later = two_checkpoints
  shutil.copytree(pristine, tmp_path / 'ckpt')
  HARMLESS[damage](str(tmp_path / 'ckpt' / '2'))
  with warnings.catch_warnings():
    warnings.simplefilter('error', RuntimeWarning)
    restored, _, step = Checkpointer(str(tmp_path / 'ckpt')).restore(
        jax.eval_shape(lambda: {'state': state}), move_aside=True)
  assert step == 2 and tree_equal(keyless(restored), keyless({'state': later}))


def test_a_named_unreadable_step_is_an_error_and_without_move_aside_nothing_moves(
    tmp_path, two_checkpoints):
  pristine, state, _ = two_checkpoints
  shutil.copytree(pristine, tmp_path / 'ckpt')
  CORRUPTIONS['one flipped bit'](str(tmp_path / 'ckpt' / '2'))   # zstd still decodes it
  abstract = jax.eval_shape(lambda: {'state': state})
  ckpt = Checkpointer(str(tmp_path / 'ckpt'))
  with pytest.raises(CheckpointError, match=r'checkpoint 2 in .* is unreadable: .*checksum '
                                            r'mismatch'):
    ckpt.restore(abstract, step=2)
  with pytest.warns(RuntimeWarning, match='skipping unreadable checkpoint 2'):
    assert ckpt.restore(abstract)[2] == 1
  assert ckpt.steps() == [1, 2] and not glob.glob(f'{tmp_path}/ckpt/*unreadable*')


@pytest.fixture
def small_disk(tmp_path):
  """A 512 KiB tmpfs, so that a save really runs out of space (needs root)."""
  yield from tmpfs(tmp_path / 'disk', '512k')


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


def test_a_background_save_that_fails_is_named_by_its_step_and_orbax_logs_no_error(
    small_disk, trained, caplog):
  """Issue 28.8: step 2's asynchronous save fails and is noticed at step 3's
  save: the error names step 2, not 3; orbax's own ERROR records (tracebacks
  on stderr) go to purax.checkpoint at DEBUG; a failed write leaves no orbax
  task to die in a closed event loop (no unraisable report at collection)."""
  _, _, state, _ = trained
  caplog.set_level('DEBUG', logger='purax.checkpoint')
  ckpt = Checkpointer(str(small_disk / 'ckpt'))
  ckpt.save(1, {'state': state})
  ckpt.wait()
  fill(small_disk)
  unraisable = []
  hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
  try:
    ckpt.save(2, {'state': state})   # started; it fails in the background
    with pytest.raises(CheckpointError, match=r'^saving checkpoint 2 in .*ckpt failed: .*No '
                                              r'space left on device'):
      ckpt.save(3, {'state': state})
    with contextlib.suppress(CheckpointError):
      ckpt.close()
    del ckpt
    gc.collect()
  finally:
    sys.unraisablehook = hook
  assert not unraisable, [u.exc_value for u in unraisable]
  assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
  assert [r for r in caplog.records if r.name == 'purax.checkpoint' and r.exc_info]
  os.remove(small_disk / 'filler')
  assert Checkpointer(str(small_disk / 'ckpt')).steps() == [1]


def test_no_checkpoint_and_unwritable_directory(tmp_path, trained):
  _, _, state, _ = trained
  with pytest.raises(CheckpointError, match='expected a committed checkpoint, got none'):
    Checkpointer(str(tmp_path / 'empty')).restore(jax.eval_shape(lambda: {'state': state}))
  (tmp_path / 'file').write_text('x')
  with pytest.raises(CheckpointError, match='expected writable'):
    Checkpointer(str(tmp_path / 'file' / 'ckpt'))


def test_a_bfloat16_checkpoint_into_a_float32_target_is_refused_never_cast(tmp_path):
  tree = {'w': jax.numpy.ones((3, 2), jax.numpy.bfloat16)}
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, tree)
    ckpt.wait()
    target = {'w': jax.ShapeDtypeStruct((3, 2), jax.numpy.float32)}
    with pytest.raises(CheckpointMismatchError,
                       match=r"checkpoint 1 in .*: \['w'\]: expected float32\[3, 2\] \(the "
                             r"current model\), got bfloat16\[3, 2\] in the checkpoint"):
      ckpt.restore(target)
    assert ckpt.steps() == [1]     # a mismatch is not unreadable: nothing skipped or moved


def test_saving_a_small_state_compiles_nothing_and_stores_host_copies(tmp_path, monkeypatch):
  # Shapes no other test uses, so no program is in jit's cache already.
  state = {'w': jax.numpy.ones((13, 11)), 'n': jax.numpy.int32(3), 'k': jax.random.key(5)}
  handed = []
  standard_save = manager.ocp.args.StandardSave
  monkeypatch.setattr(manager.ocp.args, 'StandardSave',
                      lambda tree, **k: handed.append(tree) or standard_save(tree, **k))
  with compilations() as compiles, Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {'state': state})
  assert compiles == [], compiles
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(handed)), handed
  restored, _, _ = Checkpointer(str(tmp_path)).restore(jax.eval_shape(lambda: {'state': state}))
  assert tree_equal(keyless(restored), keyless({'state': state}))


def _small_state():
  task, batch = tiny_task('mlp'), tiny_batch()
  return task.init(jax.random.key(0), batch)


@pytest.mark.parametrize('context', ['set_mesh with abstract shardings',
                                     'set_mesh without shardings', 'no mesh, no shardings'])
def test_restore_works_in_every_sharding_context(tmp_path, context):
  state = _small_state()
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {'state': state})
  mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Explicit,))
  P = jax.sharding.PartitionSpec
  with contextlib.ExitStack() as stack:
    if context.startswith('set_mesh'):
      stack.enter_context(jax.set_mesh(mesh))
    abstract = jax.eval_shape(lambda: {'state': state})
    if context == 'set_mesh with abstract shardings':
      # An explicit-axes mesh: eval_shape gives shardings on an abstract mesh.
      abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
          x.shape, x.dtype, sharding=jax.sharding.NamedSharding(
              jax.sharding.get_abstract_mesh(), P('data') if x.shape[:1] == (64,) else P())),
          abstract)
      assert isinstance(jax.tree.leaves(abstract)[1].sharding.mesh, jax.sharding.AbstractMesh)
    with warnings.catch_warnings():
      warnings.simplefilter('error', RuntimeWarning)    # nothing is "unreadable"
      restored, _, step = Checkpointer(str(tmp_path)).restore(abstract, move_aside=True)
  assert step == 1 and tree_equal(keyless(restored), keyless({'state': state}))
  kernel = restored['state'].params['Dense_0']['kernel']
  if context == 'set_mesh with abstract shardings':
    assert kernel.sharding.spec == P('data') and kernel.sharding.mesh == mesh
  elif context == 'set_mesh without shardings':
    assert kernel.sharding.is_fully_replicated and len(kernel.sharding.device_set) == 8
  else:
    assert kernel.sharding.device_set == {jax.local_devices()[0]}


def test_an_error_that_is_not_the_files_surfaces_with_its_reason_and_moves_nothing(tmp_path):
  state = _small_state()
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {'state': state})
  mesh = jax.make_mesh((8,), ('data',))
  # 10 classes cannot be split over 8 devices: the target's fault, not the files'.
  bad = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  abstract = jax.eval_shape(lambda: {'state': state})
  abstract['state'].params['Dense_1']['bias'] = jax.ShapeDtypeStruct((10,), np.float32,
                                                                     sharding=bad)
  with pytest.raises(CheckpointError, match=r'checkpoint 1 in .*: the files are intact, but '
                                            r'restoring onto the target failed: '):
    Checkpointer(str(tmp_path)).restore(abstract, move_aside=True)
  assert Checkpointer(str(tmp_path)).steps() == [1] and not glob.glob(f'{tmp_path}/*unread*')


KEEP_BEST_SCRIPT = '''
import sys, jax, numpy as np
from purax.io.checkpoint import Checkpointer
directory, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
accuracy = {1: 0.5, 2: 0.9, 3: 0.7, 4: 0.6, 5: None, 6: 0.4}
with Checkpointer(directory, keep_last=1, keep_best=1) as ckpt:
  for step in range(first, last + 1):
    metrics = None if accuracy[step] is None else {'eval/accuracy': accuracy[step]}
    ckpt.save(step, {'w': np.full((2,), step, np.float32)}, metrics=metrics)
    ckpt.wait()
  print(ckpt.steps())
'''


def test_keep_best_decisions_survive_a_restart_in_a_fresh_process(tmp_path):
  """Issue 14.3: saves 1..3, then a new process (a resumed run) saves 4..6."""
  env = dict(os.environ, XLA_FLAGS=os.environ.get('PURAX_TEST_CHILD_XLA_FLAGS', ''))
  root = str(pathlib.Path(__file__).resolve().parents[3])    # the repository
  env['PYTHONPATH'] = root + os.pathsep + env.get('PYTHONPATH', '')
  for first, last, kept in [(1, 3, '[2, 3]'), (4, 6, '[2, 6]')]:
    done = subprocess.run([sys.executable, '-c', KEEP_BEST_SCRIPT, str(tmp_path), str(first),
                           str(last)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == kept


@pytest.mark.parametrize('how', ['renamed', 'linked'])
def test_a_step_directory_recording_another_step_is_not_restored(tmp_path, two_checkpoints,
                                                                  how):
  """Issue 28.1: step 1 renamed (or linked) to 3 is not checkpoint 3: restore
  names it and falls back to 2; asked for step 3, it refuses."""
  pristine, state, later = two_checkpoints
  directory = tmp_path / 'ckpt'
  shutil.copytree(pristine, directory)
  if how == 'renamed':
    os.rename(directory / '1', directory / '3')
  else:
    (directory / '3').symlink_to('1')
  abstract = jax.eval_shape(lambda: {'state': state})
  ckpt = Checkpointer(str(directory))
  assert 3 in ckpt.steps()
  with pytest.raises(CheckpointError, match=r'checkpoint 3 in .* is unreadable: .*records step '
                                            r'1 .*not 3, the name of its directory'):
    ckpt.restore(abstract, step=3)
  with pytest.warns(RuntimeWarning, match=r'skipping unreadable checkpoint 3 .*records step 1'):
    restored, _, step = ckpt.restore(abstract)
  assert step == 2 and tree_equal(keyless(restored), keyless({'state': later}))


def test_would_keep_and_best_step_follow_keep_best_across_a_new_checkpointer(tmp_path):
  """A save is among the best K when its metric beats the worst of the best
  kept (Checkpoint saves at every such evaluation); a new Checkpointer on the
  directory (a resumed run) ranks as the one before it did."""
  tree = {'x': np.arange(3, dtype=np.float32)}
  with Checkpointer(str(tmp_path), keep_last=1, keep_best=2, best_metric='eval/loss',
                    best_mode='min') as ckpt:
    assert ckpt.would_keep({'eval/loss': 5.0}) and not ckpt.would_keep({'train/loss': 1.0})
    assert not ckpt.would_keep({'eval/loss': float('nan')})
    for step, loss in ((10, 3.0), (20, 1.0)):
      ckpt.save(step, tree, metrics={'eval/loss': loss})
    assert not ckpt.would_keep({'eval/loss': 3.0})         # not better than the worst kept
    assert ckpt.would_keep({'eval/loss': 2.5})
    ckpt.save(30, tree, metrics={'eval/loss': 2.0})
    ckpt.wait()
    assert ckpt.best_step() == 20 and ckpt.steps() == [20, 30]
  with Checkpointer(str(tmp_path), keep_best=2, best_metric='eval/loss', best_mode='min') as again:
    assert not again.would_keep({'eval/loss': 2.5}) and again.would_keep({'eval/loss': 1.5})
  with Checkpointer(str(tmp_path), keep_best=0) as off:
    assert not off.would_keep({'eval/accuracy': 1.0})
  with Checkpointer(str(tmp_path), read_only=True, best_metric='eval/accuracy') as reader:
    with pytest.raises(CheckpointError, match="expected a checkpoint that records "
                                              "'eval/accuracy'"):
      reader.best_step()


def test_a_read_only_checkpointer_creates_cleans_and_renames_nothing(tmp_path, trained):
  """A reader beside a writer: the writer's unfinished save stays, an
  unreadable checkpoint is skipped but not moved aside, a missing directory is
  not created, and a save is refused by name."""
  _, _, state, _ = trained
  with Checkpointer(str(tmp_path)) as writer:
    writer.save(1, {'state': state})
    writer.save(2, {'state': state})
  unfinished = tmp_path / '3.orbax-checkpoint-tmp-99'
  (unfinished / 'state').mkdir(parents=True)
  os.remove(next(glob.iglob(str(tmp_path / '2' / 'extra' / '*'))))   # checkpoint 2 unreadable
  before = sorted(os.listdir(tmp_path))
  abstract = jax.eval_shape(lambda: {'state': state})
  with Checkpointer(str(tmp_path), read_only=True) as reader:
    with pytest.warns(RuntimeWarning, match='skipping unreadable checkpoint 2'):
      _, _, step = reader.restore(abstract, move_aside=True)
    assert step == 1
    with pytest.raises(CheckpointError, match='opened read-only .* expected no save'):
      reader.save(4, {'state': state})
  assert sorted(os.listdir(tmp_path)) == before
  with pytest.raises(CheckpointError, match='expected a directory to read, got none'):
    Checkpointer(str(tmp_path / 'missing'), read_only=True)
  assert not (tmp_path / 'missing').exists()


def test_an_equinox_models_state_restores_and_resumes_bitwise(tmp_path):
  """Equinox params are an eqx.Module (a dataclass without flax's replace): the
  layout touches no framework's methods, so the state saves, restores and
  trains on bitwise (it raised AttributeError: 'Linear' object has no
  attribute 'replace')."""
  eqx = pytest.importorskip('equinox')
  import optax
  from purax.nn.equinox import from_equinox
  make = lambda key: eqx.nn.MLP(64, 10, width_size=8, depth=1, key=key)   # noqa: E731
  flat = lambda batch: batch['x'].reshape(batch['x'].shape[0], 64)         # noqa: E731
  task = purax.Task(model=from_equinox(make, inputs=flat), tx=optax.adam(1e-3))
  batch = tiny_batch()
  step = jax.jit(task.step)
  from purax.io.checkpoint.run import checkpoint_tree
  state = task.init(jax.random.key(0), batch)
  state, metrics = step(state, batch)
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, checkpoint_tree(state, metrics))
  restored = purax.restore_or_init(str(tmp_path), task, jax.random.key(1), batch)
  assert restored.step == 1
  straight, _ = step(state, batch)
  resumed, _ = step(restored.state, batch)
  assert tree_equal(keyless(straight), keyless(resumed))
