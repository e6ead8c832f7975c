"""purax plot: PNG curves for a run directory and for a sweep directory."""

import json
import os

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
  rows = [{'rank': i + 1, 'member': i, 'seed': i % 2, 'learning_rate': [1e-3, 1e-2][i // 2],
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
  assert data.startswith(PNG) and len(data) > 20_000       # three panels of curves, not blank


def test_sweep_plot_writes_a_png_through_the_cli(tmp_path, capsys):
  sweep = write_sweep(tmp_path / 'sweep')
  out = tmp_path / 'other' / 'sweep.png'
  out.parent.mkdir()
  assert cli.main(['plot', '--workdir', str(sweep), '--out', str(out)]) == 0
  assert json.loads(capsys.readouterr().out)['plot'] == str(out)
  assert out.read_bytes().startswith(PNG)


def test_sweep_legend_names_the_hyperparameters_that_differ():
  rows = [{'member': 0, 'seed': 0, 'learning_rate': 1e-3, 'weight_decay': 1e-4},
          {'member': 1, 'seed': 1, 'learning_rate': 1e-3, 'weight_decay': 1e-4},
          {'member': 2, 'seed': 0, 'learning_rate': 3e-2, 'weight_decay': 1e-4}]
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


def _tree(root):
  """``relative path -> (bytes or None for a directory, or the link's target)``."""
  out = {}
  for dirpath, dirs, files in os.walk(root):
    for name in dirs + files:
      path = os.path.join(dirpath, name)
      rel = os.path.relpath(path, root)
      if os.path.islink(path):
        out[rel] = ('link', os.readlink(path))
      elif os.path.isdir(path):
        out[rel] = None
      else:
        with open(path, 'rb') as f:
          out[rel] = f.read()
  return out


def test_out_never_replaces_the_runs_files_a_directory_or_a_non_png(tmp_path, monkeypatch,
                                                                    capsys):
  """--out naming a file of the run (also through a symlink, or a link to its
  directory), anything under its subdirectories, an existing directory or
  non-PNG file, or a path whose directory does not exist is refused (ConfigError
  naming out, exit 2) before anything is drawn; every byte stays as it was."""
  run = write_run(tmp_path / 'run')
  (run / 'checkpoints' / '40').mkdir(parents=True)
  (run / 'checkpoints' / '40' / 'state').write_bytes(b'arrays')
  (tmp_path / 'notes.txt').write_bytes(b'mine')
  (tmp_path / 'dir').mkdir()
  (tmp_path / 'to_config').symlink_to(run / 'config.json')
  (tmp_path / 'to_run').symlink_to(run)
  monkeypatch.setattr(plot, '_pyplot', lambda: pytest.fail('drew before checking --out'))
  before = _tree(tmp_path)
  refused = {
      run / 'config.json': "the run's own 'config.json'",
      run / 'metrics.jsonl': "the run's own 'metrics.jsonl'",
      run / 'final_metrics.json': "the run's own 'final_metrics.json'",   # not written yet
      run / 'checkpoints': "the run's own 'checkpoints'",
      run / 'checkpoints' / '40' / 'state': "the run's own 'checkpoints/40/state'",
      run / 'checkpoints' / 'new.png': "the run's own 'checkpoints/new.png'",
      tmp_path / 'to_config': "the run's own 'config.json'",
      tmp_path / 'to_run' / 'metrics.jsonl': "the run's own 'metrics.jsonl'",
      tmp_path / 'notes.txt': 'an existing file that is not a PNG',
      tmp_path / 'dir': 'a directory',
      tmp_path / 'nowhere' / 'x.png': 'its directory does not exist',
  }
  for out, why in refused.items():
    with pytest.raises(ConfigError) as e:
      plot.plot(str(run), str(out))
    assert str(e.value).startswith(
        "out: expected a new or PNG file outside the run's own files, in an existing "
        f"directory, got {str(out)!r}"), e.value
    assert why in str(e.value), (why, e.value)
    assert cli.main(['plot', '--workdir', str(run), '--out', str(out)]) == 2
    assert 'out: expected' in capsys.readouterr().err
  assert _tree(tmp_path) == before
  sweep = write_sweep(tmp_path / 'sweep')
  (sweep / 'best').mkdir()
  before = _tree(sweep)
  for name in ('sweep.json', 'best/config.json'):
    with pytest.raises(ConfigError, match=f"the run's own '{name}'"):
      plot.plot(str(sweep), str(sweep / name))
  assert _tree(sweep) == before


def test_out_may_replace_a_png_or_be_a_new_file(tmp_path):
  run = write_run(tmp_path / 'run')
  assert plot.plot(str(run)) == str(run / 'curves.png')
  old = (run / 'curves.png').read_bytes()
  (run / 'curves.png').write_bytes(PNG + b'older')
  assert plot.plot(str(run), str(run / 'curves.png')) == str(run / 'curves.png')
  assert (run / 'curves.png').read_bytes() == old       # drawn again
  other = tmp_path / 'elsewhere.png'
  assert plot.plot(str(run), str(other)) == str(other)
  assert other.read_bytes().startswith(PNG)


RECORDS = [
    {'step': 10, 'time': 0.0, 'train/loss': 1.0, 'train/accuracy': 0.5, 'train/grad_norm': 1.0,
     'train/learning_rate': 1e-3, 'train/skipped': 0.0, 'steps_per_sec': 50.0, 'compile_s': 2.0},
    {'step': 10, 'grad_norm/Dense_0': 0.5, 'grad_norm/Dense_1': 0.25},
    {'step': 20, 'train/loss': 0.5, 'train/learning_rate': 5e-4, 'steps_per_sec': 60.0},
    {'step': 20, 'eval/loss': 0.6, 'eval/accuracy': 0.8, 'eval_ema/loss': 0.55,
     'eval_ema/accuracy': 0.82, 'early_stopping/stale': 0},
]


def test_every_logged_series_is_in_a_panel_or_on_the_note():
  """Issue 29.4: eval_ema/* beside eval/*, the per-layer grad_norm/* of
  --histograms beside train/grad_norm, the logged learning rate. A series
  that does not change (or has one point) is on the note, not in a panel,
  unless a panel of its quantity is drawn; timings are on the note. Nothing
  is left out."""
  layout = plot.panels(RECORDS)
  assert layout == {'loss': ['train/loss', 'eval/loss', 'eval_ema/loss'],
                    'learning rate': ['train/learning_rate']}
  assert plot.constants(RECORDS) == {
      'train/accuracy': '0.5', 'eval/accuracy': '0.8', 'eval_ema/accuracy': '0.82',
      'train/grad_norm': '1', 'grad_norm/Dense_0': '0.5', 'grad_norm/Dense_1': '0.25',
      'train/skipped': '0', 'early_stopping/stale': '0'}
  assert plot.timings(RECORDS) == {'steps_per_sec': 'median 55', 'compile_s': 'total 2'}
  keys = {k for r in RECORDS for k in r if k not in ('step', 'time')}
  placed = [k for ks in layout.values() for k in ks] + list(plot.constants(RECORDS)) + list(
      plot.timings(RECORDS))
  assert sorted(placed) == sorted(keys)
  changing = RECORDS + [{'step': 30, 'train/accuracy': 0.7, 'train/grad_norm': 0.5,
                         'grad_norm/Dense_0': 0.1, 'train/skipped': 2.0}]
  layout = plot.panels(changing)
  assert layout['accuracy'] == ['train/accuracy', 'eval/accuracy', 'eval_ema/accuracy']
  assert layout['grad norm'] == ['train/grad_norm', 'grad_norm/Dense_0', 'grad_norm/Dense_1']
  assert layout['skipped'] == ['train/skipped']
  assert list(layout)[:4] == ['loss', 'accuracy', 'learning rate', 'grad norm']
  assert plot.panels([{'step': 10, 'steps_per_sec': 5.0}], schedule=True) == {
      'learning rate': []}                  # drawn from config.json


def _drawn(monkeypatch):
  """The figures the plots save, kept after they are drawn."""
  from matplotlib.figure import Figure
  figures, real = [], Figure.savefig
  monkeypatch.setattr(Figure, 'savefig', lambda self, *a, **k: figures.append(self)
                      or real(self, *a, **k))
  return figures


def _titles(fig):
  return [ax.get_title() for ax in fig.axes if ax.get_visible()]


def _labels(fig, title):
  [ax] = [ax for ax in fig.axes if ax.get_visible() and ax.get_title() == title]
  return [line.get_label() for line in ax.get_lines()]


def test_constant_series_get_no_panel_and_the_note_names_them(tmp_path, monkeypatch):
  """What a run logs, with its end record: the panels are loss (train and
  eval), accuracy (train and eval), learning rate and grad norm; examples,
  skipped, the skip streak and the timings are one note line under them."""
  figures = _drawn(monkeypatch)
  run = tmp_path / 'run'
  run.mkdir()
  lines = []
  for s in (10, 20, 30, 40):
    lines.append({'step': s, 'time': 0.0, 'train/loss': 2.0 / s, 'train/accuracy': s / 50,
                  'train/grad_norm': 1.0 + 1 / s, 'train/learning_rate': 1e-3 * (1 - s / 50),
                  'train/examples': 64.0, 'train/skipped': 0.0, 'train/skip_streak': 0.0,
                  'steps_per_sec': 90.0 + s, 'compile_s': 3.5 if s == 10 else 0.0})
    if s % 20 == 0:
      lines.append({'step': s, 'eval/loss': 2.5 / s, 'eval/accuracy': s / 60,
                    'eval/examples': 360.0})
  lines.append({'step': 40, 'status': 'finished', 'end': {'reason': 'steps'}})
  (run / 'metrics.jsonl').write_text('\n'.join(json.dumps(r) for r in lines) + '\n')
  plot.plot(str(run))
  [fig] = figures
  assert _titles(fig) == ['loss', 'accuracy', 'learning rate', 'grad norm']
  assert _labels(fig, 'loss') == ['train/loss', 'eval/loss']
  assert _labels(fig, 'accuracy') == ['train/accuracy', 'eval/accuracy']
  assert fig.get_supxlabel() == (
      'constant: train/examples=64, eval/examples=360, train/skipped=0, '
      'train/skip_streak=0; timing: steps_per_sec median 115, compile_s total 3.5')


def _overlaps(fig):
  """Pairs of the figure's title, note and legends, the panels' titles and
  the panels (with their tick labels and axis labels) whose drawn boxes
  intersect (a panel and its own title aside)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  canvas = FigureCanvasAgg(fig)        # drawn again as saved (the pyplot canvas is closed)
  canvas.draw()
  renderer = canvas.get_renderer()
  boxes = [('suptitle', None, fig._suptitle.get_window_extent(renderer))]
  if fig.get_supxlabel():
    boxes.append(('note', None, fig._supxlabel.get_window_extent(renderer)))
  boxes += [(f'legend {i}', None, legend.get_window_extent(renderer))
            for i, legend in enumerate(fig.legends)]
  for i, ax in enumerate(ax for ax in fig.axes if ax.get_visible()):
    boxes.append((f'title of panel {i}', i, ax.title.get_window_extent(renderer)))
    boxes.append((f'panel {i}', i, ax.get_tightbbox(renderer, bbox_extra_artists=[])))
  return [(a, b) for n, (a, owner, box) in enumerate(boxes) for b, other, box_b in boxes[n + 1:]
          if (owner is None or owner != other) and box.overlaps(box_b)]


def test_sweep_plot_titles_legend_and_note_do_not_overlap(tmp_path, monkeypatch):
  """Twelve members with long labels, every family of loss: a short panel
  title (a small legend says which line style is which family), and no
  title, legend, note or panel overlaps another (in one row of panels, where
  the old tight layout put a legend of three rows over the axes' labels)."""
  figures = _drawn(monkeypatch)
  sweep = write_sweep(tmp_path / 'sweep')
  summary = json.loads((sweep / 'sweep.json').read_text())
  summary['members'] = [{'rank': i + 1, 'member': i, 'seed': i % 2, 'status': 'ok',
                         'learning_rate': 10 ** -(1 + i % 3), 'weight_decay': 10 ** -(i % 4),
                         'label_smoothing': i / 100} for i in range(12)]
  history = [{'step': s, 'train/loss': [1.0 / (s * (i + 1)) for i in range(12)],
              'train/grad_norm': [float(s + i) for i in range(12)],
              'train/accuracy': [0.5] * 12, 'train/examples': [64] * 12, 'steps_per_sec': [50.0]} for s in (10, 20)]
  history.append({'step': 20, 'eval/loss': [0.3] * 12, 'eval_ema/loss': [0.2] * 12})
  summary['history'] = history
  (sweep / 'sweep.json').write_text(json.dumps(summary))
  plot.plot(str(sweep))
  [fig] = figures
  assert _titles(fig) == ['loss', 'learning rate', 'grad norm']
  assert fig.get_supxlabel() == ('constant: train/accuracy=0.5, train/examples=64; '
                                 'timing: steps_per_sec median 50')
  assert _overlaps(fig) == []


def test_the_run_plot_draws_every_series_and_a_sweep_marks_pbt_exploits(tmp_path,
                                                                         monkeypatch):
  from matplotlib.axes import Axes
  from matplotlib.figure import Figure
  monkeypatch.setattr(Figure, 'savefig', lambda self, *a, **k: None)   # what is drawn, not
  monkeypatch.setattr(Figure, 'tight_layout', lambda self, *a, **k: None)   # its pixels
  drawn, marks = [], []
  real_plot, real_axvline = Axes.plot, Axes.axvline
  monkeypatch.setattr(Axes, 'plot', lambda self, *a, **k: drawn.append(k.get('label'))
                      or real_plot(self, *a, **k))
  monkeypatch.setattr(Axes, 'axvline', lambda self, x, **k: marks.append(x)
                      or real_axvline(self, x, **k))
  run = tmp_path / 'run'
  run.mkdir()
  (run / 'metrics.jsonl').write_text('\n'.join(json.dumps(r) for r in RECORDS) + '\n')
  plot.plot(str(run))
  assert set(drawn) == {k for ks in plot.panels(RECORDS).values() for k in ks}
  assert marks == []
  sweep = write_sweep(tmp_path / 'sweep')
  summary = json.loads((sweep / 'sweep.json').read_text())
  summary['history'] += [{'step': 10, 'pbt/source': [0, 1, 2, 3]},      # nobody copied
                         {'step': 20, 'pbt/source': [0, 1, 0, 3]}]      # member 2 <- 0
  assert plot.exploit_steps(summary['history']) == [20]
  (sweep / 'sweep.json').write_text(json.dumps(summary))
  plot.plot(str(sweep))
  assert set(marks) == {20} and len(marks) == len(plot.panels(summary['history'], schedule=True))


def test_the_schedule_drawn_for_a_wsd_run_is_its_warmup_stable_decay():
  """``--schedule wsd``: warmup to step 10, constant, a 1-sqrt cooldown of 40
  steps from step 50 (not the optimizer's cosine)."""
  config = {'steps': 100, 'learning_rate': 1e-2, 'warmup_steps': 10, 'schedule': 'wsd',
            'decay_start': 50.0, 'cooldown_steps': 40.0}
  steps, lr = plot.learning_rates(config, points=101)
  want = [1e-2 * min(s / 10, 1 - np.sqrt(np.clip((s - 50) / 40, 0, 1))) for s in steps]
  np.testing.assert_allclose(lr, want, rtol=1e-5, atol=1e-9)   # float32
  # unset: the last 20% of --steps
  _, lr = plot.learning_rates({**config, 'decay_start': -1.0, 'cooldown_steps': 0.0},
                              points=101)
  assert lr[80] == pytest.approx(1e-2) and lr[90] == pytest.approx(1e-2 * (1 - np.sqrt(0.5)))
