"""What a `purax train` run shows and leaves, seen as a user would: its output
through a pipe (no terminal), the model summary, the TensorBoard HParams and
config, the learning rate in metrics.jsonl and TensorBoard, the best
checkpoints by a chosen metric, and a --profile trace of the chosen steps."""

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
       '--log-every', '4', '--eval-every', '0',
       '--steps-per-call', '4',      # the profiled steps 5-7 still run one per call
       '--profile', '5:8', '--workdir', str(workdir),
       # issue 29.7: keep-best and early stopping by one rule, any logged metric
       '--checkpoint-every', '4', '--keep-last', '1', '--keep-best', '1',
       '--best-metric', 'train/loss', '--best-mode', 'max', '--patience', '1000'],
      env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
  assert out.returncode == 0, out.stdout.decode()[-3000:]
  return workdir, out.stdout.decode()


@pytest.mark.slow
def test_without_a_terminal_each_log_point_is_one_plain_line(piped_run):
  _, output = piped_run
  assert '\r' not in output and '\x1b' not in output      # no progress frames, no escapes
  log_lines = [l for l in output.splitlines() if l.startswith('[step ')]
  # One line per log point: what every hook wrote at that step (the final
  # evaluation and --patience's count on the last one).
  assert [l.split()[1] + l.split()[2].split('/')[0] for l in log_lines] == [
      '4]train', '8]train', '12]train']
  assert 'eval/loss=' in log_lines[-1] and 'early_stopping/stale=' in log_lines[-1]
  for line in log_lines:     # nothing else glued onto a log line
    assert line.count('[step ') == 1 and 'it/s' not in line and '%|' not in line
  # Issue 29.3/29.4: the learning rate on every line; the first window's
  # compilation is compile_s, not part of steps_per_sec; zero counters are not shown.
  assert all('train/learning_rate=' in l for l in log_lines[:3])
  assert 'compile_s=' in log_lines[0]
  assert not any('skipped=0 ' in l or 'skip_streak=0' in l for l in log_lines)


@pytest.mark.slow
def test_the_run_starts_with_the_model_summary(piped_run):
  _, output = piped_run
  head = output[:output.index('[step ')]
  assert 'Dense_0' in head and 'Dense_2' in head
  assert 'total' in head and '85,002' in head                # 64*256+256 + 256*256+256 + 256*10+10
  assert 'state per device:' in head


@pytest.mark.slow
def test_tensorboard_events_hold_the_hparams_and_the_config(piped_run):
  from purax.app.config import TrainConfig
  workdir, _ = piped_run
  hparams = tb_events.hparams_of(workdir)
  assert hparams['model'] == 'mlp' and hparams['steps'] == 12
  assert hparams['learning_rate'] == pytest.approx(2e-3)
  assert 'num_classes' not in hparams                       # None is left out
  # Issue 29.4: only the fields that change the computation (their metadata),
  # and no experiment record, so TensorBoard marks the columns that differ.
  config = TrainConfig.from_json((workdir / 'config.json').read_text())
  assert set(hparams) == {k for k, v in config.hparams().items() if v is not None}
  assert {'dry_run', 'progress', 'workdir', 'debug_nans', 'profile_memory', 'keep_best',
          'profile', 'log_every'}.isdisjoint(hparams)
  values = tb_events.summary_values(workdir)
  assert '_hparams_/experiment' not in values
  (text,) = values['config/text_summary']
  config = json.loads(text.tensor.string_val[0].decode())
  assert config == json.loads((workdir / 'config.json').read_text())
  assert 'train/loss' in values and 'eval/accuracy' in values
  # Issue 29.3: the learning rate the updates applied, at every log point, in
  # TensorBoard and metrics.jsonl alike (warmup, clamped to --steps 12: at step s
  # the s-th update applied 2e-3 * (s - 1) / 12).
  records = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  logged = {r['step']: r['train/learning_rate'] for r in records if 'train/loss' in r}
  assert logged == pytest.approx({s: 2e-3 * (s - 1) / 12 for s in (4, 8, 12)}, rel=1e-5)
  assert [v.simple_value for v in values['train/learning_rate']] == pytest.approx(
      list(logged.values()), rel=1e-6)


@pytest.mark.slow
def test_keep_best_and_patience_use_the_chosen_metric_and_mode(piped_run):
  """Issue 29.7: --best-metric train/loss --best-mode max: of the saves at 4, 8
  and 12 the one of the highest training loss is kept beside the newest, and
  --patience checks the same rule at every log point (a train metric)."""
  workdir, _ = piped_run
  records = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  loss = {r['step']: r['train/loss'] for r in records if 'train/loss' in r}
  worst = max(loss, key=loss.get)
  kept = sorted(int(d) for d in os.listdir(workdir / 'checkpoints') if d.isdigit())
  assert kept == sorted({worst, 12}) and worst != 12
  stale = [r['step'] for r in records if 'early_stopping/stale' in r]
  assert stale == [4, 8, 12]


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
