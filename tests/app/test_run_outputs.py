"""What a `purax train` run shows and leaves, seen as a user would: its output
through a pipe (no terminal), the model summary, the TensorBoard HParams and
config, and a --profile trace of the chosen steps."""

import glob
import gzip
import json
import os
import subprocess
import sys

import pytest

from tests import tb_events

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope='module')
def piped_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('run') / 'r'
  env = {k: v for k, v in os.environ.items() if not k.startswith('PURAX_')}
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  # progress is on (the default): without a terminal no bar may be drawn.
  out = subprocess.run(
      [sys.executable, '-m', 'purax', 'train', '--model', 'mlp', '--steps', '12',
       '--log-every', '4', '--eval-every', '0', '--checkpoint-every', '0',
       '--steps-per-call', '4',      # the profiled steps 5-7 still run one per call
       '--profile', '5:8', '--workdir', str(workdir)],
      env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
  assert out.returncode == 0, out.stdout.decode()[-3000:]
  return workdir, out.stdout.decode()


@pytest.mark.slow
def test_without_a_terminal_each_log_point_is_one_plain_line(piped_run):
  _, output = piped_run
  assert '\r' not in output and '\x1b' not in output      # no progress frames, no escapes
  log_lines = [l for l in output.splitlines() if l.startswith('[step ')]
  assert [l.split()[1] + l.split()[2].split('/')[0] for l in log_lines] == [
      '4]train', '8]train', '12]train', '12]eval']
  for line in log_lines:     # nothing else glued onto a log line
    assert line.count('[step ') == 1 and 'it/s' not in line and '%|' not in line


@pytest.mark.slow
def test_the_run_starts_with_the_model_summary(piped_run):
  _, output = piped_run
  head = output[:output.index('[step ')]
  assert 'Dense_0' in head and 'Dense_2' in head
  assert 'total' in head and '85,002' in head                # 64*256+256 + 256*256+256 + 256*10+10
  assert 'state per device:' in head


@pytest.mark.slow
def test_tensorboard_events_hold_the_hparams_and_the_config(piped_run):
  workdir, _ = piped_run
  hparams = tb_events.hparams_of(workdir)
  assert hparams['model'] == 'mlp' and hparams['steps'] == 12
  assert hparams['learning_rate'] == pytest.approx(2e-3)
  assert 'num_classes' not in hparams                       # None is left out
  values = tb_events.summary_values(workdir)
  (text,) = values['config/text_summary']
  config = json.loads(text.tensor.string_val[0].decode())
  assert config == json.loads((workdir / 'config.json').read_text())
  assert 'train/loss' in values and 'eval/accuracy' in values


@pytest.mark.slow
def test_profile_leaves_a_trace_of_the_chosen_steps_in_the_run_directory(piped_run):
  workdir, output = piped_run
  (trace,) = glob.glob(str(workdir / 'plugins' / 'profile' / '*' / 'perfetto_trace.json.gz'))
  assert glob.glob(os.path.join(os.path.dirname(trace), '*.xplane.pb'))
  with gzip.open(trace) as f:
    events = json.load(f)
  events = events['traceEvents'] if isinstance(events, dict) else events
  steps = sorted(int(e['args']['step_num']) for e in events if e.get('name') == 'train')
  assert steps == [5, 6, 7]
  assert f'profile of steps [5, 8) written to {workdir}' in output
