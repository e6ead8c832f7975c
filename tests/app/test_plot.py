"""purax plot: PNG curves for a run directory and for a sweep directory."""

import json

import numpy as np
import pytest

from purax.app import cli, plot
from purax.core.errors import ConfigError

PNG = b'\x89PNG\r\n\x1a\n'


def write_run(d, steps=40):
  d.mkdir()
  config = {'model': 'mlp', 'dataset': 'digits', 'steps': steps, 'learning_rate': 2e-3,
            'warmup_steps': 5}
  (d / 'config.json').write_text(json.dumps(config))
  lines = []
  for s in range(10, steps + 1, 10):
    lines.append(json.dumps({'step': s, 'time': 0.0, 'train/loss': 2.0 / s, 'train/accuracy': s / 50,
                             'train/grad_norm': 1.0, 'steps_per_sec': 100.0}))
    if s % 20 == 0:
      lines.append(json.dumps({'step': s, 'eval/loss': 2.5 / s, 'eval/accuracy': s / 60}))
  lines.append('{"step": 50, "train/lo')        # torn by a kill: skipped
  (d / 'metrics.jsonl').write_text('\n'.join(lines) + '\n')
  return d


def write_sweep(d, members=4):
  d.mkdir()
  rows = [{'rank': i + 1, 'member': i, 'seed': i % 2, 'peak_learning_rate': [1e-3, 1e-2][i // 2],
           'weight_decay': 1e-4, 'status': 'ok'} for i in range(members)]
  history = [{'step': s, 'train/loss': [1.0 / (s * (i + 1)) for i in range(members)],
              'train/accuracy': [0.5] * members, 'train/grad_norm': [1.0, None, 2.0, 'nan'][:members]}
             for s in (10, 20)]
  history.append({'step': 20, 'eval/loss': [0.3] * members, 'eval/accuracy': [0.9] * members})
  summary = {'config': {'model': 'mlp', 'dataset': 'digits', 'steps': 20, 'warmup_steps': 2,
                        'pbt_every': 0}, 'metric': 'loss', 'members': rows, 'history': history}
  (d / 'sweep.json').write_text(json.dumps(summary))
  return d


def test_run_plot_writes_a_png(tmp_path):
  run = write_run(tmp_path / 'run')
  path = plot.plot(str(run))
  assert path == str(run / 'curves.png')
  data = (run / 'curves.png').read_bytes()
  assert data.startswith(PNG) and len(data) > 20_000       # four panels of curves, not blank


def test_sweep_plot_writes_a_png_through_the_cli(tmp_path, capsys):
  sweep = write_sweep(tmp_path / 'sweep')
  out = tmp_path / 'other' / 'sweep.png'
  assert cli.main(['plot', '--workdir', str(sweep), '--out', str(out)]) == 0
  assert json.loads(capsys.readouterr().out)['plot'] == str(out)
  assert out.read_bytes().startswith(PNG)


def test_sweep_legend_names_the_hyperparameters_that_differ():
  rows = [{'member': 0, 'seed': 0, 'peak_learning_rate': 1e-3, 'weight_decay': 1e-4},
          {'member': 1, 'seed': 1, 'peak_learning_rate': 1e-3, 'weight_decay': 1e-4},
          {'member': 2, 'seed': 0, 'peak_learning_rate': 3e-2, 'weight_decay': 1e-4}]
  assert plot.member_labels(rows) == {0: 'lr=0.001 seed=0', 1: 'lr=0.001 seed=1',
                                      2: 'lr=0.03 seed=0'}
  same = [dict(r, seed=0) for r in rows[:2]]
  assert plot.member_labels(same) == {0: 'lr=0.001', 1: 'lr=0.001'}


def test_learning_rate_curve_is_the_runs_schedule():
  steps, lr = plot.learning_rates({'steps': 100, 'learning_rate': 1e-2, 'warmup_steps': 10})
  assert steps[0] == 0 and steps[-1] == 100
  assert lr[0] == 0 and np.isclose(lr.max(), 1e-2) and steps[np.argmax(lr)] == 10
  assert np.isclose(lr[-1], 0.0, atol=1e-9)


def test_not_a_run_directory_is_an_error_naming_it(tmp_path, capsys):
  with pytest.raises(ConfigError, match='workdir: expected a run directory .metrics.jsonl. or a sweep'):
    plot.plot(str(tmp_path))
  assert cli.main(['plot', '--workdir', str(tmp_path)]) == 2


def test_the_png_replaces_a_link_and_is_never_written_through_one(tmp_path):
  """Issue 28.1: links planted at curves.png and at its temporaries leave their
  target unchanged; curves.png becomes the run's own file."""
  run = write_run(tmp_path / 'run')
  victim = tmp_path / 'victim'
  victim.write_bytes(b'precious')
  for name in ('curves.png', 'curves.png.tmp', 'curves.png.tmp.png'):
    (run / name).symlink_to(victim)
  assert plot.plot(str(run)) == str(run / 'curves.png')
  assert victim.read_bytes() == b'precious'
  assert not (run / 'curves.png').is_symlink()
  assert (run / 'curves.png').read_bytes().startswith(PNG)
