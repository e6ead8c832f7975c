"""The fault suite (issue 13): each kind of fault a user's cluster delivers,
end to end through the command line in fresh processes, with its right value.

The corrupt-checkpoint kinds are one parameterized test in
tests/io/test_checkpoint.py; here the run that meets one finishes.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers_checkpoint import CORRUPTIONS
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
  assert first.returncode == 0, err
  reached = json.loads(out.strip().splitlines()[-1])['final']['step']
  records = [json.loads(l) for l in open(os.path.join(workdir, 'metrics.jsonl'))]
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
    'gc': ('SIGINT', 130, None),            # swallowed by Python before: trained on, exit 0
    'data': ('SIGTERM', 143, None),
    'summary': ('SIGTERM', 143, None),      # before: a step-1 checkpoint, exit 0
    'first_step': ('SIGINT', 130, None),
    'training': ('SIGTERM', 0, 5),
    'evaluation': ('SIGTERM', 0, 6),
    'final_save': ('SIGTERM', 0, 12),
    'double': ('SIGTERM', 143, None),
    'double_gc': ('SIGTERM', 143, None),
}


@pytest.mark.parametrize('phase', sorted(PHASES))
def test_a_signal_at_each_phase_is_answered_as_documented(tmp_path, phase):
  """Issue 28.3 (and 13.6): a first SIGTERM/SIGINT from the moment ``main``
  installs its handlers is never lost: during start-up (up to the first
  step's compilation) 128+N with nothing written; during training and
  evaluation a checkpoint at the step, exit 0; during the final save the run
  finishes; a second signal 128+N at once, also where Python swallows the
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
  said = (f'{name} arrived as the run finished; step 12 is committed' if phase == 'final_save'
          else f'stopped by {name}')
  assert said in err, err[-3000:]
  if committed is None:           # nothing written: no directory left behind
    assert not workdir.exists(), os.listdir(workdir)
    return
  assert sorted(os.listdir(workdir / 'checkpoints')) == [str(committed)]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  if phase == 'final_save':
    assert json.load(open(workdir / 'final_metrics.json'))['step'] == 12
  else:
    assert out['final'] == {'stopped_by': name, 'step': committed}
