"""The fault suite (issue 13): each kind of fault a user's cluster delivers,
end to end through the command line in fresh processes, with its right value.

The corrupt-checkpoint kinds are one parameterized test in
tests/io/checkpoint/test_manager.py; here the run that meets one finishes.
"""

import errno
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers_checkpoint import CORRUPTIONS, tmpfs
from tests.helpers import assert_bitwise
from tests.helpers_runs import ARGS, ENV, ROOT, final_tree, logged, purax


def test_an_unreadable_newest_checkpoint_is_moved_aside_and_the_run_finishes_bitwise(
    tmp_path, straight_run):
  """Issue 13.1/13.4: silently flipped bytes in the newest checkpoint (the
  hardest kind: every file still decodes) -> fall back with a warning, keep
  the bad one as 20.unreadable-1, finish; final state and metrics as straight."""
  straight, broken = straight_run, str(tmp_path / 'broken')
  first = purax('train', *ARGS, '--workdir', broken, recorded_stop=20)
  assert first.returncode == 0, first.stderr
  CORRUPTIONS['one flipped bit'](os.path.join(broken, 'checkpoints', '20'))
  resumed = purax('train', '--workdir', broken)
  assert resumed.returncode == 0, resumed.stderr
  assert 'skipping unreadable checkpoint 20' in resumed.stderr
  # Where the flipped bit lands (a chunk's data or its compression framing)
  # decides whether the checksum or the reader notices first; either way the
  # checkpoint is unreadable and moved aside.
  assert 'from step 10' in resumed.stderr
  a, _, step_a = final_tree(straight)
  b, _, step_b = final_tree(broken)
  assert step_a == step_b == 40
  assert_bitwise(a, b)
  assert logged(straight) == logged(broken)
  assert os.path.isdir(os.path.join(broken, 'checkpoints', '20.unreadable-1'))
  assert json.load(open(os.path.join(broken, 'final_metrics.json')))['step'] == 40


def _wait_for(predicate, proc, timeout=120):
  deadline = time.time() + timeout
  while not predicate():
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.time() < deadline, 'timed out'
    time.sleep(0.1)


def test_a_second_run_on_a_workdir_is_refused_at_once_naming_the_holder(tmp_path):
  """Issue 13.3: the second run exits 2 naming pid and host; the first is untouched."""
  workdir = str(tmp_path / 'run')
  cmd = [sys.executable, '-m', 'purax', 'train', '--model', 'mlp', '--steps', '100000',
         '--checkpoint-every', '50', '--eval-every', '0', '--log-every', '10', '--no-progress',
         '--workdir', workdir]
  first = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
  try:
    _wait_for(lambda: glob.glob(os.path.join(workdir, 'checkpoints', '[0-9]*')), first)
    second = purax('train', '--workdir', workdir)
    assert second.returncode == 2, second.stderr
    assert (f'expected no other run using {workdir}, got one: process {first.pid} on host '
            in second.stderr), second.stderr
    assert 'Traceback' not in second.stderr and 'run directory' not in second.stderr
    # at once: before the data is loaded and the model traced (whose summary,
    # a table headed "parameters", every traced run prints)
    assert 'parameters' not in second.stderr, second.stderr
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=120)
  finally:
    if first.poll() is None:
      first.kill()
  assert first.returncode == 143, err
  reached = json.loads(out.strip().splitlines()[-1])['final']['step']
  records = [json.loads(l) for l in open(os.path.join(workdir, 'metrics.jsonl'))]
  assert records[-1]['status'] == 'stopped' and records[-1]['end']['signal'] == 'SIGTERM'
  records = records[:-1]
  # The first run's records are whole: one per log point (every 10 steps) up to
  # where the signal stopped it (the window after the last log point is in its
  # checkpoint, logged by the run that resumes it).
  assert [r['step'] for r in records] == list(range(10, reached - reached % 10 + 1, 10))


def test_a_stale_lock_of_a_killed_run_is_taken_over(tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  holder = subprocess.Popen(
      [sys.executable, '-c', 'import sys, time; from purax.app.rundir import WorkdirLock; '
       'lock = WorkdirLock(sys.argv[1]); print("locked", flush=True); time.sleep(600)',
       str(workdir)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == 'locked'
    from purax.app.rundir import WorkdirLock
    from purax.core.errors import ConfigError
    with pytest.raises(ConfigError, match=f'process {holder.pid} on host '):
      WorkdirLock(str(workdir))
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  assert json.loads((workdir / '.purax.lock').read_text())['pid'] == holder.pid   # stale
  done = purax('train', *ARGS, '--steps', '10', '--workdir', str(workdir))
  assert done.returncode == 0, done.stderr
  assert json.loads((workdir / '.purax.lock').read_text())['pid'] != holder.pid


# Each phase of a run, the signal that arrives there, and the documented
# answer (README, "Signals"): the exit status and the checkpoint committed
# (None: nothing written).
PHASES = {
    'gc': ('SIGINT', 130, None),            # recorded, answered at the first poll
    'data': ('SIGTERM', 143, None),
    'summary': ('SIGTERM', 143, None),      # before: a step-1 checkpoint, exit 0
    'first_step': ('SIGINT', 130, None),
    'training': ('SIGTERM', 143, 5),      # before: exit 0
    'evaluation': ('SIGTERM', 143, 6),
    'final_save': ('SIGTERM', 143, 12),
    'double': ('SIGTERM', 143, None),
    'double_gc': ('SIGTERM', 143, None),
}


@pytest.mark.parametrize('phase', sorted(PHASES))
def test_a_signal_at_each_phase_is_answered_as_documented(tmp_path, phase):
  """Issue 28.3 (and 13.6): a first SIGTERM/SIGINT from the moment ``main``
  installs its handlers is never lost: during start-up (up to the first
  step's compilation) 128+N with nothing written; during training and
  evaluation a checkpoint at the step, exit 128+N (said); during the final save
  the run finishes, exit 128+N (said); a second signal 128+N at once, also where Python swallows the
  handler's exception (a gc callback). Never a traceback."""
  name, status, committed = PHASES[phase]
  workdir = tmp_path / 'run'
  done = subprocess.run(
      [sys.executable, '-m', 'tests.scripts.signal_at_phase', phase, name, 'train',
       '--model', 'mlp', '--steps', '12', '--log-every', '2', '--eval-every', '6',
       '--checkpoint-every', '0', '--no-progress', '--workdir', str(workdir)],
      cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  err = done.stderr
  assert 'Traceback' not in err and 'Exception ignored' not in err, err[-3000:]
  assert done.returncode == status, err[-3000:]
  said = (f'{name} arrived as the run ended; step 12 is committed (exit status {status})'
          if phase == 'final_save' else f'stopped by {name}')
  assert said in err, err[-3000:]
  if committed is None:           # nothing written: no directory left behind
    assert not workdir.exists(), os.listdir(workdir)
    return
  assert sorted(os.listdir(workdir / 'checkpoints')) == [str(committed)]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  if phase == 'final_save':
    assert json.load(open(workdir / 'final_metrics.json'))['step'] == 12
    assert out['final']['stopped_by'] == name
  else:
    assert f'(exit status {status})' in err
    assert out['final'] == {'stopped_by': name, 'step': committed}


# What orbax printed around a failure before purax reported it once (issue 28.8).
NOISE = ('Traceback', 'Event loop is closed', 'Exception ignored', 'ERROR:absl', 'Warning:')


def _noise(stderr):
  return [line for line in stderr.splitlines() if any(n in line for n in NOISE)]


def test_resuming_past_unreadable_checkpoints_prints_one_line_and_no_orbax_noise(tmp_path):
  """Issue 28.8: the kinds of damage whose failed read left orbax's tasks
  behind (a traceback per array, 'Event loop is closed', coroutines that die
  at a later collection): one warning line naming the step, nothing else."""
  first = str(tmp_path / 'first')
  done = purax('train', *ARGS, '--steps', '20', '--workdir', first)
  assert done.returncode == 0, done.stderr
  for kind in ('empty manifest.ocdbt', 'deleted data file'):
    workdir = str(tmp_path / kind.replace(' ', '_'))
    shutil.copytree(first, workdir)
    CORRUPTIONS[kind](os.path.join(workdir, 'checkpoints', '20'))
    resumed = purax('train', '--workdir', workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert not _noise(resumed.stderr), (kind, resumed.stderr[-3000:])
    warned = [l for l in resumed.stderr.splitlines() if 'skipping' in l or 'checkpoint 20' in l]
    assert len(warned) == 1 and warned[0].startswith(
        'purax: skipping unreadable checkpoint 20 in '), (kind, resumed.stderr[-3000:])
    assert 'from step 10' in resumed.stderr


@pytest.fixture
def small_disk(tmp_path):
  """A 16 MiB tmpfs, so that a save really runs out of space (needs root)."""
  yield from tmpfs(tmp_path / 'disk', '16m')


def test_a_full_disk_names_the_step_whose_save_failed_in_one_line_and_resumes_after(
    small_disk):
  """Issue 28.8: the disk fills before step 15's (background) save, noticed
  when step 20 saves: one purax error naming step 15 and the cause, no
  traceback; with space again the next start removes the failed save's
  *.orbax-checkpoint-tmp and the run finishes from step 10."""
  workdir = str(small_disk / 'run')
  args = ARGS[:ARGS.index('--checkpoint-every')] + ['--checkpoint-every', '5'] + ARGS[
      ARGS.index('--checkpoint-every') + 2:]
  done = purax('train', *args, '--steps', '10', '--workdir', workdir)
  assert done.returncode == 0, done.stderr
  filler = os.open(small_disk / 'filler', os.O_WRONLY | os.O_CREAT)
  try:
    while True:
      os.write(filler, b'0' * 65536)
  except OSError as e:
    assert e.errno == errno.ENOSPC
  os.ftruncate(filler, os.fstat(filler).st_size - 256 * 1024)   # room for the logs only
  os.close(filler)
  failed = purax('train', '--workdir', workdir, '--steps', '40')
  assert failed.returncode == 2, failed.stderr
  assert not _noise(failed.stderr), failed.stderr[-3000:]
  (error,) = [l for l in failed.stderr.splitlines() if 'error' in l.lower()]
  assert error.startswith('purax: error: saving checkpoint 15 in '), error
  assert "No space left on device [os_error_code='28']" in error and 'spec' not in error, error
  checkpoints = os.path.join(workdir, 'checkpoints')
  assert glob.glob(os.path.join(checkpoints, '15.orbax-checkpoint-tmp*'))   # what it left
  os.remove(small_disk / 'filler')
  resumed = purax('train', '--workdir', workdir, '--steps', '40')
  assert resumed.returncode == 0, resumed.stderr
  assert 'from step 10' in resumed.stderr and not _noise(resumed.stderr)
  assert not glob.glob(os.path.join(checkpoints, '*.orbax-checkpoint-tmp*'))
  assert json.load(open(os.path.join(workdir, 'final_metrics.json')))['step'] == 40


def test_the_next_start_removes_what_a_killed_save_left(tmp_path):
  """Issue 28.8: a save killed mid-write leaves N.orbax-checkpoint-tmp; the next
  start removes it (orbax's cleanup_tmp_directories) and resumes."""
  workdir = str(tmp_path / 'run')
  done = purax('train', *ARGS, '--workdir', workdir, recorded_stop=20)
  assert done.returncode == 0, done.stderr
  checkpoints = os.path.join(workdir, 'checkpoints')
  killed = os.path.join(checkpoints, '25.orbax-checkpoint-tmp')   # as a killed save leaves it
  shutil.copytree(os.path.join(checkpoints, '20'), killed)
  os.rename(os.path.join(killed, 'state'), os.path.join(killed, 'state.orbax-checkpoint-tmp'))
  os.remove(os.path.join(killed, 'commit_success.txt'))
  resumed = purax('train', '--workdir', workdir)
  assert resumed.returncode == 0, resumed.stderr
  assert 'from step 20' in resumed.stderr and not _noise(resumed.stderr)
  assert not glob.glob(os.path.join(checkpoints, '*.orbax-checkpoint-tmp*'))
  assert json.load(open(os.path.join(workdir, 'final_metrics.json')))['step'] == 40
