"""What a run prints when its output is a file (issue 29.2): `python -c
"<the README's fit snippet>" > log` and `purax sweep ... > log` write one
plain line per log point; `logging` silences them. One fresh process (no
terminal, no pytest handlers), its stdout a file."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = '''
import logging, sys
import jax
import purax
from purax.io import datasets, pipeline
from purax.app import cli

ds = datasets.load('digits')
task = purax.Task(model=purax.nn.MLP(num_classes=10, features=(16,)),
                  tx=purax.adamw(learning_rate=2e-3, total_steps=12, warmup_steps=2))
train = pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=32, seed=0, num_steps=12)
test = pipeline.eval_batches(ds.x_test, ds.y_test, batch_size=256)
state, history = purax.fit(task, task.init(jax.random.key(0), train[0]), train,
                           hooks=purax.hooks.standard(eval_data=test, log_every=4))
print('--- sweep', flush=True)
assert cli.main(['sweep', '--lr', '1e-3,2e-3', '--steps', '4', '--batch-size', '16',
                 '--log-every', '2', '--eval-every', '4', '--workdir', sys.argv[1]]) == 0
print('--- silenced', flush=True)
logging.getLogger('purax').setLevel(logging.WARNING)
purax.fit(task, task.init(jax.random.key(0), train[0]), train,
          hooks=purax.hooks.standard(log_every=4))
print('--- end', flush=True)
'''


def log_points(text):
  """``[(step, family)]`` of the ``[step N] family/...`` lines of ``text``."""
  return [(int(l.split()[1][:-1]), l.split()[2].split('/')[0]) for l in text.splitlines()
          if l.startswith('[step ')]


def test_fit_and_sweep_write_one_plain_line_per_log_point_to_a_file(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith('PURAX_')}
  env['XLA_FLAGS'] = os.environ.get('PURAX_TEST_CHILD_XLA_FLAGS', '')
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  log = tmp_path / 'log'
  with open(log, 'w') as out:
    done = subprocess.run([sys.executable, '-c', SCRIPT, str(tmp_path / 'sweep')], cwd=ROOT,
                          env=env, stdout=out, stderr=subprocess.PIPE, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  text = log.read_text()
  assert '\r' not in text and '\x1b' not in text              # no progress-bar frames
  fit, rest = text.split('--- sweep\n')
  sweep, rest = rest.split('--- silenced\n')
  silenced, _ = rest.split('--- end\n')
  # One line per log point, with what every hook wrote there (the evaluation at the end).
  assert log_points(fit) == [(4, 'train'), (8, 'train'), (12, 'train')]
  assert log_points(sweep) == [(2, 'train'), (4, 'train')]
  assert all(len([l for l in part.splitlines() if 'eval/loss=' in l]) == 1
             for part in (fit, sweep))
  assert 'train/loss=' in fit and 'train/loss=' in sweep
  assert log_points(silenced) == []
  assert '[step' not in done.stderr                           # stdout only, once
