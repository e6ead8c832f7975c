import json
import os
import signal
import subprocess
import sys

import pytest

from purax.core.errors import ConfigError
from purax.io import writers


def test_default_writer_writes_jsonl_and_event_files(tmp_path):
  w = writers.create_default_writer(str(tmp_path), console=False)
  w.write_scalars(10, {'train/loss': 0.5, 'train/nan': float('nan')})
  w.close()
  records = [json.loads(l) for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert records[0]['step'] == 10 and records[0]['train/loss'] == 0.5
  assert records[0]['train/nan'] == 'nan'
  assert list(tmp_path.glob('events.out.tfevents.*'))


KILLED_WRITER = '''
import os, signal, sys
from purax.io import writers
w = writers.create_default_writer(sys.argv[1], console=False)
for step in (10, 20, 30):
  w.write_scalars(step, {'train/loss': step / 100})
os.kill(os.getpid(), signal.SIGKILL)     # no close, no flush, no atexit
'''


def test_every_record_written_is_on_disk_when_the_process_is_killed(tmp_path):
  """Issue 13.2: records written before a SIGKILL survive, in both files."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {**os.environ, 'PYTHONPATH': root + os.pathsep + os.environ.get('PYTHONPATH', '')}
  done = subprocess.run([sys.executable, '-c', KILLED_WRITER, str(tmp_path)], env=env,
                        capture_output=True, timeout=120)
  assert done.returncode == -signal.SIGKILL, done.stderr
  records = [json.loads(l) for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert [r['step'] for r in records] == [10, 20, 30]
  events = b''.join(p.read_bytes() for p in tmp_path.glob('events.out.tfevents.*'))
  assert events.count(b'train/loss') == 3


def test_jsonl_never_holds_a_bare_nan(tmp_path):
  w = writers.JsonlWriter(str(tmp_path / 'm.jsonl'))
  w.write_scalars(1, {'a': float('inf'), 'b': float('-inf'), 'c': float('nan')})
  w.close()
  text = (tmp_path / 'm.jsonl').read_text()
  assert json.loads(text, parse_constant=lambda c: pytest.fail(f'bare {c}')) is not None


def test_a_linked_metrics_file_is_refused_and_its_target_left_unchanged(tmp_path):
  """Issue 28.1: metrics.jsonl is never appended through a link."""
  victim = tmp_path / 'victim'
  victim.write_text('precious')
  run = tmp_path / 'run'
  run.mkdir()
  (run / 'metrics.jsonl').symlink_to(victim)
  with pytest.raises(ConfigError, match=r'metrics\.jsonl: expected a regular file .*got a '
                                        r'symlink to .*victim'):
    writers.create_default_writer(str(run), console=False)
  assert victim.read_text() == 'precious'


def test_a_log_line_shows_counters_only_when_not_zero_and_a_population_as_its_range():
  """Issue 29.4: no `train/skip_streak=0 train/skipped=0` on every line; the
  values still go to the file writers (JsonlWriter writes what it is given)."""
  import numpy as np
  line = writers.format_line(50, {'train/loss': 0.12345, 'train/skipped': 0.0,
                                  'train/skip_streak': 0, 'compile_s': 0.0,
                                  'early_stopping/stale': 0, 'steps_per_sec': 41.0})
  assert line == '[step 50] train/loss=0.1235 steps_per_sec=41'
  line = writers.format_line(60, {'train/loss': 0.5, 'train/skipped': 2.0, 'compile_s': 1.5})
  assert line == '[step 60] train/loss=0.5 train/skipped=2 compile_s=1.5'
  assert writers.format_line(4, {'train/loss': np.array([0.5, 0.25, np.nan])}) == (
      '[step 4] train/loss=0.25..0.5')
  assert writers.format_line(4, {'early_stopping/stale': 0}) is None     # no empty line
