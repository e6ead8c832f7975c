"""Every `purax` command answers SIGTERM/SIGINT the same way (README, "When
something goes wrong"): it exits with the status it prints (128 + N, also
for a train/sweep/tune that committed a checkpoint and says so), says it once
and then stops, never crashes (no traceback, no segmentation fault) and
leaves no half-written output. A few moments per command here (start-up and
mid-work, a second signal); ``tests/faults/signal_storm.py`` sends 20 at
random moments to each."""

import json
import os

import pytest

from tests.helpers_signals import SWEEP, TINY, TUNE, make_runs, printed_status, signal_at


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """A small classifier run with a saved non-finite update (eval, export, plot,
  debug-nan) and a small language model run (generate), trained in this process."""
  return make_runs(tmp_path_factory.mktemp('signals'))


# (command, moment, signals, status): a train/sweep/tune stopped at a step or
# as it finished is checked by the command's case below.
CASES = [
    ('train', 'build', 'SIGTERM', 143),
    ('sweep', 'parse', 'SIGINT', 130),
    ('sweep', 'step:3', 'SIGTERM', 143),
    ('sweep', 'step:3', 'SIGTERM,SIGTERM', 143),
    ('tune', 'build', 'SIGINT', 130),
    ('tune', 'step:3', 'SIGINT', 130),
    ('tune', 'write', 'SIGTERM', 143),
    ('eval', 'parse', 'SIGINT', 130),
    ('eval', 'evaluate', 'SIGTERM', 143),
    ('export', 'restore', 'SIGTERM', 143),
    ('export', 'export', 'SIGINT', 130),
    ('export', 'export', 'SIGTERM,SIGINT', 130),   # the second one's status
    ('generate', 'restore', 'SIGINT', 130),
    ('debug-nan', 'build', 'SIGTERM', 143),
    ('debug-nan', 'finish', 'SIGINT', 130),
    ('plot', 'parse', 'SIGTERM', 143),
    ('plot', 'write', 'SIGTERM', 143),          # after its last poll: written, and said
    ('plot', 'write', 'SIGINT,SIGINT', 130),
]


def command(name, d, out):
  """The command line of ``name``, writing under ``out``."""
  return {
      'train': ['train', *TINY, '--steps', '4', '--workdir', out / 'w'],
      'sweep': [*SWEEP, '--workdir', out / 'w'],
      'tune': [*TUNE, '--workdir', out / 'w'],
      'eval': ['eval', '--workdir', d / 'run'],
      'export': ['export', '--workdir', d / 'run', '--out', out / 'export'],
      'generate': ['generate', '--workdir', d / 'lm', '--prompt', 'def ', '--max-new-tokens', '4'],
      'debug-nan': ['debug-nan', '--workdir', d / 'run'],
      'plot': ['plot', '--workdir', d / 'run', '--out', out / 'curves.png'],
  }[name]


@pytest.mark.slow
@pytest.mark.parametrize('name, moment, signals, status', CASES,
                         ids=[f'{c}-{m}-{s}' for c, m, s, _ in CASES])
def test_a_signal_ends_every_command_with_the_status_it_prints(runs, tmp_path, name, moment,
                                                               signals, status):
  done = signal_at(moment, signals, *command(name, runs, tmp_path))
  said = printed_status(done)
  assert done.returncode == status, done.stderr[-3000:]
  first, last = signals.split(',')[0], signals.split(',')[-1]
  finished = 'as the command finished; its output is complete' in done.stderr
  # A train/sweep/tune stopped by one signal after its start: a checkpoint at the
  # step, or its result written as it finished; resumable either way, said.
  resumable = name in ('sweep', 'tune') and signals == first and moment in ('step:3', 'write')
  assert said == status, done.stderr[-3000:]
  if resumable:
    assert (f'stopped by {first} at step 3' in done.stderr or
            f'{first} arrived as the range test finished' in done.stderr), done.stderr[-3000:]
  else:        # it said that it stopped, by which signal, and printed no result (or was done)
    assert f'stopped by {last}' in done.stderr, done.stderr[-3000:]
    # a first signal is answered at a safe point, named; only a second one at once
    assert ('a second signal' in done.stderr) == (first != signals), done.stderr[-3000:]
    assert finished or not done.stdout.strip().startswith('{'), done.stdout[-500:]
  leftovers = [p for p in os.listdir(tmp_path) if '.partial-' in p or '.replaced-' in p
               or p.endswith('.tmp')]
  assert not leftovers
  if name == 'export':          # said "nothing written": nothing was
    assert not os.path.exists(tmp_path / 'export'), os.listdir(tmp_path / 'export')
  if name == 'plot' and moment == 'write' and signals == first:
    assert finished
  if name == 'export' and os.path.exists(tmp_path / 'export'):   # absent or complete
    from purax.io import export
    export.load_predict(str(tmp_path / 'export'))
  if name == 'plot' and os.path.exists(tmp_path / 'curves.png'):
    assert (tmp_path / 'curves.png').read_bytes()[:4] == b'\x89PNG'
  if name in ('sweep', 'tune', 'train') and not resumable:   # a new directory: nothing left
    assert not (tmp_path / 'w').exists(), os.listdir(tmp_path / 'w')
  if resumable:
    out = json.loads(done.stdout.strip().splitlines()[-1])
    result = out.get('sweep') or out['lr_range']
    if moment == 'write':      # the test had finished: its result written, and said
      assert f'{first} arrived as the range test finished' in done.stderr
      json.load(open(tmp_path / 'w' / 'lr_range.json'))
      assert result['suggestion'] > 0
    else:
      assert result == {'stopped_by': first, 'step': 3}
      assert f'(exit status {status})' in done.stderr
      assert 'checkpoint committed' in done.stderr and 'run the same command' in done.stderr
      steps = sorted(int(s) for s in os.listdir(tmp_path / 'w' / 'checkpoints'))
      assert steps == ([2, 3] if name == 'sweep' else [3])   # sweep: --log-every 2 too
