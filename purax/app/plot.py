"""``purax plot --workdir DIR``: learning curves of a run or a sweep, as a PNG;
and the curve of a learning-rate range test (``purax tune lr``, :func:`plot_lr_range`).

Only series that carry information get a panel (:func:`panels`): loss and
accuracy with every family together (``train/*`` solid, ``eval/*`` dashed,
``eval_ema/*`` dotted: the eval curve beside the training one), the
learning rate (``train/learning_rate`` as logged; for a run logged before it
was, the schedule recomputed from ``config.json``), the gradient norm with
the per-layer ``grad_norm/*`` of ``--histograms``, and a panel for each other
quantity that changes. A series whose values are all equal, or that has one
point, draws no panel of its own: its name and value go into one note line
under the figure (:func:`constants`; e.g. ``train/examples=64,
train/skipped=0``). Timings (``steps_per_sec``, ``tokens_per_sec``, ``mfu``,
``compile_s``: :data:`purax.io.writers.TIMINGS`) measure the machine, not
the learning: no panel, their median (``compile_s``: total) on the note
(:func:`timings`). PBT's exploit steps (:func:`exploit_steps`: a member
copied another) are grey vertical lines on every panel. A run directory is
read from its ``metrics.jsonl`` (the run's end records skipped) and
``config.json``; a sweep directory from its ``sweep.json``, with one colour
per member and a legend naming each member by the hyperparameters that
differ across the sweep (and its seed).

An ``--out`` path is checked before anything is read or drawn
(:func:`check_out`): the plot never replaces a file of the run or sweep it
draws, nor anything that is not a PNG.

matplotlib is in the ``cli`` extra and imported on use, with the Agg backend
(no display needed).
"""

from __future__ import annotations

import io
import json
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from purax.app import hparam_table as hparams_lib
from purax.app.config import TrainConfig
from purax.core.bounds import RENAMED
from purax.core.errors import ConfigError, expect
from purax.app import optimizer_table
from purax.app.optimizer_table import OPTIMIZERS
from purax.core.optim import SCHEDULES
from purax.io.safe_files import open_file, write_atomic
from purax.io.writers import TIMINGS

#: Line styles of the families (the part of a name before its ``/``).
STYLES = {'train': '-', 'eval': '--', 'eval_ema': ':'}

#: The panels drawn first, and the quantities (names after the family) each
#: holds; every other quantity that changes gets a panel of its own, after them.
MAIN_PANELS = (('loss', ('loss',)), ('accuracy', ('accuracy',)),
               ('learning rate', ('learning_rate',)), ('grad norm', ('grad_norm',)))

#: The entries purax writes at the top of a run or sweep directory: an
#: ``--out`` there is refused, existing or not (the run may write it later).
#: Everything in a subdirectory (``checkpoints/``, ``best/``, ``nonfinite/``,
#: an export, a profile) is refused too.
RUN_ENTRIES = ('config.json', 'metrics.jsonl', 'final_metrics.json', 'sweep.json',
               'member.json', 'lr_range.json', 'lr_range.png', '.purax.lock', 'checkpoints',
               'best', 'nonfinite', 'export', 'members')

#: The first bytes of every PNG file.
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'

#: Record keys that are not series.
NOT_SERIES = ('step', 'time', 'pbt/source')

#: Quantities that measure the machine, not the learning: on the note, never a panel.
TIMING = tuple(k for k in TIMINGS if k not in NOT_SERIES)


def _quantity(key: str) -> str:
  return key.split('/', 1)[1] if '/' in key else key


def _keys(records: Sequence[Mapping]) -> list[str]:
  """Every key of ``records`` holding numbers (a number, or a population's
  ``[members]`` list; null and 'nan' strings as non-finite), in first-seen order."""
  keys: dict[str, None] = {}
  for r in records:
    for k, v in r.items():
      if k not in NOT_SERIES and (isinstance(v, (int, float, list)) or v is None
                                  or isinstance(v, str)) and not isinstance(v, bool):
        keys.setdefault(k)
  return list(keys)


def _values(records: Sequence[Mapping], key: str) -> tuple[int, np.ndarray]:
  """``(points, values)``: how many records hold ``key``, and all their values
  (a population's every member) as floats."""
  held = [r[key] for r in records if key in r]
  return len(held), np.asarray([_number(x) for v in held for x in np.ravel(v)], np.float64)


def _flat(records: Sequence[Mapping], key: str) -> bool:
  """Whether ``key`` is one point, or one value throughout (NaN equals NaN)."""
  points, values = _values(records, key)
  return points <= 1 or np.unique(values).size <= 1 or bool(np.all(np.isnan(values)))


def _grouped(records: Sequence[Mapping]) -> dict[str, list[str]]:
  """``panel title -> keys`` of every non-timing series, empty main panels kept."""
  out: dict[str, list[str]] = {title: [] for title, _ in MAIN_PANELS}
  where = {q: title for title, quantities in MAIN_PANELS for q in quantities}
  for key in _keys(records):
    if _quantity(key) in TIMING:
      continue
    title = 'grad norm' if key.startswith('grad_norm/') else where.get(
        _quantity(key), _quantity(key).replace('_', ' '))
    out.setdefault(title, []).append(key)
  return out


def panels(records: Sequence[Mapping], schedule: bool = False) -> dict[str, list[str]]:
  """``panel title -> keys``: the panels drawn, and the series each holds.

  A panel is drawn when one of its series changes (more than one point, not
  all equal); it then holds all of them, constant ones included (a final
  evaluation's one point beside the training curve). The :data:`MAIN_PANELS`
  group by quantity (``eval/loss`` and ``eval_ema/loss`` beside
  ``train/loss``; the per-layer ``grad_norm/LAYER`` beside
  ``train/grad_norm``); any other quantity gets a panel of its own. Timings
  (:data:`TIMING`) get none. ``schedule``: the learning rate can be drawn
  from the config, so its panel stays when no learning rate was logged.
  Every other series is in :func:`constants`.
  """
  out = {t: keys for t, keys in _grouped(records).items()
         if any(not _flat(records, k) for k in keys)}
  if schedule and 'learning rate' not in out and not any(
      _quantity(k) == 'learning_rate' for k in _keys(records)):
    out['learning rate'] = []
  order = [title for title, _ in MAIN_PANELS]
  return dict(sorted(out.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order
                     else len(order)))


def _fmt(v: float) -> str:
  return f'{v:.4g}'


def constants(records: Sequence[Mapping], schedule: bool = False) -> dict[str, str]:
  """``key -> value`` of the series no panel draws (:func:`panels`): each
  one value throughout or one point (a population's differing members listed)."""
  drawn = {k for keys in panels(records, schedule).values() for k in keys}
  out = {}
  for keys in _grouped(records).values():
    for key in keys:
      if key not in drawn:
        _, values = _values(records, key)
        unique = np.unique(values) if values.size else values
        out[key] = (_fmt(unique[0]) if unique.size == 1 or np.all(np.isnan(values))
                    else '[' + ', '.join(map(_fmt, values)) + ']')
  return out


def timings(records: Sequence[Mapping]) -> dict[str, str]:
  """``key -> 'median M'`` of each timing series (``compile_s``: ``'total T'``)."""
  out = {}
  for key in _keys(records):
    if _quantity(key) in TIMING:
      _, values = _values(records, key)
      values = values[np.isfinite(values)]
      if values.size:
        out[key] = (f'total {_fmt(values.sum())}' if _quantity(key) == 'compile_s'
                    else f'median {_fmt(float(np.median(values)))}')
  return out


def note(records: Sequence[Mapping], schedule: bool = False) -> str:
  """The line under the figure: the :func:`constants` and the :func:`timings`."""
  parts = []
  flat = constants(records, schedule)
  if flat:
    parts.append('constant: ' + ', '.join(f'{k}={v}' for k, v in flat.items()))
  times = timings(records)
  if times:
    parts.append('timing: ' + ', '.join(f'{k} {v}' for k, v in times.items()))
  return '; '.join(parts)


def exploit_steps(records: Sequence[Mapping]) -> list[int]:
  """The steps where PBT copied a member into another (``pbt/source[i] != i``)."""
  steps = []
  for r in records:
    source = r.get('pbt/source')
    if source is not None and any(_number(x) != i for i, x in enumerate(np.ravel(source))):
      steps.append(int(r['step']))
  return sorted(set(steps))


def _style(key: str) -> str:
  return STYLES.get(key.split('/', 1)[0] if '/' in key else '', '-')


def _inside(path: str, root: str) -> str | None:
  """``path`` relative to ``root`` when it lies inside it (both real paths), else None."""
  rel = os.path.relpath(path, root)
  return None if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def check_out(workdir: str, out: str) -> None:
  """Refuses an ``--out`` that would replace something other than a PNG the
  plot may own; reads only.

  ``out`` is taken as named and with every symlink resolved
  (``os.path.realpath``); in either form it must not be one of the run's
  entries (:data:`RUN_ENTRIES`) or lie in a subdirectory of ``workdir``, nor
  be an existing directory or an existing file that does not start with the
  PNG signature (a PNG written before, e.g. ``curves.png``, is replaced),
  and its directory must exist.

  Raises:
    ConfigError: naming ``out``, what was expected and what it is.
  """
  expected = 'a new or PNG file outside the run\'s own files, in an existing directory'
  named = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(out))),
                       os.path.basename(out))
  expect(bool(os.path.basename(out)) and os.path.isdir(os.path.dirname(named)), 'out',
         expected, f'{out!r} (its directory does not exist)' if os.path.basename(out)
         else f'{out!r} (a directory name)', ConfigError)
  root = os.path.realpath(workdir)
  for path in dict.fromkeys((named, os.path.realpath(out))):
    rel = _inside(path, root)
    expect(rel is None or (os.sep not in rel and rel not in RUN_ENTRIES), 'out', expected,
           f'{out!r}' + (f' (-> {path!r})' if path != os.path.abspath(out) else '')
           + f", the run's own {rel!r}", ConfigError)
  real = os.path.realpath(out)
  if not os.path.lexists(real):
    return
  what = ('a directory' if os.path.isdir(real) else 'a FIFO, socket or device'
          if not os.path.isfile(real) else None)
  if what is None:
    with open_file(real, 'rb') as f:
      head = f.read(len(PNG_SIGNATURE))
    what = None if head == PNG_SIGNATURE else 'an existing file that is not a PNG'
  expect(what is None, 'out', expected, f'{out!r}, {what}', ConfigError)


def _pyplot():
  try:
    import matplotlib
  except ImportError as e:
    raise ConfigError("plot: expected matplotlib (pip install 'purax[cli]'), "
                      f'got {e}') from e
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  return plt


def _number(v) -> float:
  """JSON values as floats: null and 'nan'/'inf' strings (non-finite) as NaN."""
  try:
    return float(v)
  except (TypeError, ValueError):
    return math.nan


def read_jsonl(path: str) -> list[dict]:
  """The metric records of a ``metrics.jsonl`` (a line torn by a kill is
  skipped; so are the run's end records, ``{"status": ...}``)."""
  records = []
  with open_file(path, encoding='utf-8') as f:
    for line in f:
      try:
        record = json.loads(line)
      except ValueError:
        continue   # the last line of a killed run may be cut short
      if isinstance(record, dict) and 'status' not in record:
        records.append(record)
  return records


def learning_rates(config: Mapping[str, Any], peak: float | None = None,
                   points: int = 200) -> tuple[np.ndarray, np.ndarray]:
  """``(steps, lr)`` of the run's schedule: its optimizer's
  (:data:`purax.app.optimizer_table.OPTIMIZERS`; warmup-cosine,
  :func:`purax.core.optim.warmup_cosine`, unless it says otherwise), or the
  one of its ``--schedule`` (``wsd``, with its ``decay_start`` and ``cooldown_steps``)."""
  total = int(config.get('decay_steps') or config['steps'])
  name = config.get('schedule', 'default')
  if name == 'default':
    name, extra = OPTIMIZERS[config.get('optimizer', 'adamw')].schedule, {}
  else:
    values = hparams_lib.schedule_values({k: float(config[k]) for k in
                                          ('decay_start', 'cooldown_steps') if k in config},
                                         total)
    extra = {k: values[k] for k in optimizer_table.SCHEDULE_ROWS[name]}
  schedule = SCHEDULES[name](config['learning_rate'] if peak is None else peak,
                             warmup_steps=min(int(config['warmup_steps']), total),
                             total_steps=total, **extra)
  steps = np.unique(np.linspace(0, total, min(points, total + 1)).astype(np.int64))
  return steps, np.asarray([float(schedule(int(s))) for s in steps])


def _series(records: Sequence[Mapping], key: str, member: int | None = None):
  steps, values = [], []
  for r in records:
    if key in r:
      v = r[key]
      if member is not None and isinstance(v, list):   # a value shared by all: the same
        v = v[member] if len(v) > 1 else v[0]
      steps.append(r['step'])
      values.append(_number(v))
  return np.asarray(steps), np.asarray(values, np.float64)


def _figure(plt, count: int):
  """A figure of ``count`` panels, 3 a row (4: 2 a row; none: a strip for the note),
  laid out by matplotlib's constrained layout (titles, legends and the note
  never overlap)."""
  if not count:
    fig = plt.figure(figsize=(8, 1.6), layout='constrained')
    return fig, []
  cols = 2 if count == 4 else min(3, count)
  rows = math.ceil(count / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows + 0.8), squeeze=False,
                           layout='constrained')
  for ax in axes.flat[count:]:
    ax.set_visible(False)
  return fig, list(axes.flat[:count])


def _finish(fig, axes, path: str, title: str, legend: bool, exploits=(), text: str = '') -> str:
  import textwrap
  for ax in axes:
    ax.set_xlabel('step')
    ax.grid(alpha=0.3)
    for i, s in enumerate(exploits):
      ax.axvline(s, color='0.6', linewidth=0.8, linestyle='-.',
                 label='PBT exploit' if i == 0 else None)
    if ax.get_title() == 'loss':
      lines = ax.get_lines()
      ys = np.concatenate([l.get_ydata() for l in lines]).astype(np.float64) if lines \
          else np.array([])
      if ys.size and np.all(ys[np.isfinite(ys)] > 0):
        ax.set_yscale('log')
  if legend and axes:
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
      fig.legend(handles, labels, loc='outside right upper', fontsize=8)
  fig.suptitle(title)
  if text:    # wrapped to the figure's width: about 19 characters an inch at size 8
    fig.supxlabel(textwrap.fill(text, width=int(fig.get_figwidth() * 19)), fontsize=8,
                  color='0.3')
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=100)
  plt = _pyplot()
  plt.close(fig)
  write_atomic(path, png.getvalue())
  return path


def plot_run(workdir: str, out: str | None = None) -> str:
  """Curves of one run (``metrics.jsonl`` + ``config.json``) into ``out``
  (default ``WORKDIR/curves.png``): a panel for each series that changes
  (:func:`panels`), the rest on the note under it (:func:`note`); returns the path.

  Raises:
    ConfigError: ``out`` is refused (:func:`check_out`); ``workdir`` has no
      ``metrics.jsonl``, or it has no records.
  """
  if out is not None:
    check_out(workdir, out)
  path = os.path.join(workdir, 'metrics.jsonl')
  expect(os.path.isfile(path), 'workdir', 'a run directory with metrics.jsonl',
         repr(workdir), ConfigError)
  records = read_jsonl(path)
  expect(bool(records), 'metrics.jsonl', 'at least one record', 'none', ConfigError)
  config = {}
  if os.path.isfile(os.path.join(workdir, 'config.json')):
    with open_file(os.path.join(workdir, 'config.json'), 'rb') as f:
      text = f.read()    # bytes: from_json names a file that is not UTF-8
    try:
      config = TrainConfig.from_json(text).flat()
    except ConfigError:
      config = {}    # an unreadable config: curves without the schedule
  schedule = {'steps', 'learning_rate', 'warmup_steps'} <= set(config)
  plt = _pyplot()
  layout = panels(records, schedule)
  fig, axes = _figure(plt, len(layout))
  for ax, (title, keys) in zip(axes, layout.items()):
    for key in keys:
      steps, values = _series(records, key)
      if steps.size:
        ax.plot(steps, values, _style(key), marker='.' if steps.size < 3 else None, label=key)
    if title == 'learning rate' and not keys:
      ax.plot(*learning_rates(config), label='schedule (config.json)')
    ax.set_title(title)
    if ax.get_lines():
      ax.legend(fontsize=7)
  name = f"{config.get('model', '?')} on {config.get('dataset', '?')}" if config else workdir
  return _finish(fig, axes, out or os.path.join(workdir, 'curves.png'), name,
                 legend=False, exploits=exploit_steps(records), text=note(records, schedule))


def member_labels(rows: Sequence[Mapping[str, Any]],
                  swept: Sequence[str] = ()) -> dict[int, str]:
  """``{member: 'lr=0.001 wd=0.0001 seed=1'}`` naming every swept hyperparameter
  (``swept``: state names) and whatever else differs across members (any
  hyperparameter a row holds, the seed), with the table's short names."""
  skip = {'rank', 'member', 'status', 'steps'}
  others = [k for k in rows[0] if k not in skip and k not in swept and not k.startswith('eval_')
            and len({r.get(k) for r in rows}) > 1] if rows else []
  # The table's hyperparameters first, in its order; the seed last.
  varying = list(swept) + sorted(others, key=lambda k: (k == 'seed', hparams_lib.order(k)))
  if not varying and rows and 'learning_rate' in rows[0]:
    varying = ['learning_rate']
  fmt = lambda v: f'{v:.3g}' if isinstance(v, float) else str(v)  # noqa: E731
  return {int(r['member']): ' '.join(f'{hparams_lib.label(k)}={fmt(r.get(k))}'
                                     for k in varying) for r in rows}


def plot_sweep_summary(summary: Mapping[str, Any], path: str, *, max_legend: int = 12) -> str:
  """Per-member curves of a sweep's summary (what ``sweep.json`` holds) into
  ``path``: a panel for each series that changes (:func:`panels`; line
  styles tell the families apart, a small legend says which), the rest on
  the note (:func:`note`), PBT's exploit steps marked."""
  from matplotlib.lines import Line2D
  history = summary['history']
  # A sweep written before 0.3 names the learning rate peak_learning_rate.
  rows = [{RENAMED.get(k, k): v for k, v in r.items()} for r in summary['members']]
  config = summary.get('config', {})
  labels = member_labels(rows, [RENAMED.get(k, k) for k in summary.get('swept', ())])
  members = len(rows)
  sched = {'steps': config.get('steps'), 'warmup_steps': config.get('warmup_steps'),
           'decay_steps': config.get('decay_steps'), 'learning_rate': 0.0}
  schedule = (None not in (sched['steps'], sched['warmup_steps'])
              and not config.get('pbt_every') and any('learning_rate' in r for r in rows))
  plt = _pyplot()
  layout = panels(history, schedule)
  fig, axes = _figure(plt, len(layout))
  colors = plt.get_cmap('tab10' if members <= 10 else 'viridis')
  color = lambda i: colors(i if members <= 10 else i / max(members - 1, 1))  # noqa: E731
  shared = {k for k in set().union(*history) if all(
      not isinstance(r.get(k), list) or len(r[k]) == 1 for r in history if k in r)}
  for ax, (title, keys) in zip(axes, layout.items()):
    for i in range(members):
      for n, key in enumerate(keys):
        if key in shared and i:
          continue           # one value for the whole population: once
        steps, values = _series(history, key, member=i)
        if steps.size:
          ax.plot(steps, values, _style(key), color=color(i), linewidth=1,
                  marker='.' if steps.size < 3 else None,
                  label=labels.get(i, f'member {i}') if n == 0 and ax is axes[0] else None)
    ax.set_title(title)
    families = sorted({k.split('/', 1)[0] for k in keys if '/' in k})
    if len(families) > 1:    # which line style is which family
      ax.legend([Line2D([], [], color='0.3', linestyle=_style(f + '/')) for f in families],
                families, fontsize=7)
    if title == 'learning rate' and not keys:
      for r in rows:
        if 'learning_rate' in r:
          ax.plot(*learning_rates(sched, peak=r['learning_rate']),
                  color=color(int(r['member'])), linewidth=1)
  title = f"{members} members, {config.get('model', '?')} on {config.get('dataset', '?')}"
  return _finish(fig, axes, path, title, legend=members <= max_legend,
                 exploits=exploit_steps(history), text=note(history, schedule))


def plot_sweep(workdir: str, out: str | None = None) -> str:
  """Curves of a sweep directory (``sweep.json``) into ``out`` (default
  ``WORKDIR/curves.png``); returns the path.

  Raises:
    ConfigError: ``out`` is refused (:func:`check_out`).
  """
  if out is not None:
    check_out(workdir, out)
  with open_file(os.path.join(workdir, 'sweep.json'), encoding='utf-8') as f:
    summary = json.load(f)
  return plot_sweep_summary(summary, out or os.path.join(workdir, 'curves.png'))


def plot(workdir: str, out: str | None = None) -> str:
  """A sweep's or a run's curves, whichever ``workdir`` holds; returns the PNG's path.

  Raises:
    ConfigError: ``workdir`` is neither (no ``sweep.json``, no ``metrics.jsonl``);
      ``out`` is refused (:func:`check_out`), before anything is drawn.
  """
  if os.path.isfile(os.path.join(workdir, 'sweep.json')):
    return plot_sweep(workdir, out)
  expect(os.path.isfile(os.path.join(workdir, 'metrics.jsonl')), 'workdir',
         'a run directory (metrics.jsonl) or a sweep directory (sweep.json)',
         repr(workdir), ConfigError)
  return plot_run(workdir, out)


def plot_lr_range(result, path: str, title: str = 'learning-rate range test') -> str:
  """A learning-rate range test (:class:`purax.tune.LRRange`) into the PNG ``path``.

  Left: each member's smoothed loss against its learning rate (log scale),
  diverged members marked on the top edge, the suggestion a vertical line;
  right: each member's training loss against the step, coloured by its rate.
  Returns ``path``.
  """
  plt = _pyplot()
  fig, (curve, steps) = plt.subplots(1, 2, figsize=(11, 4.5))
  lrs, smoothed = np.asarray(result.lrs, np.float64), np.asarray(result.smoothed, np.float64)
  ok = np.isfinite(smoothed)
  curve.plot(lrs[ok], smoothed[ok], 'o-', label=f'mean loss, last {result.window} steps')
  if (~ok).any():
    top = smoothed[ok].max() if ok.any() else 1.0
    curve.plot(lrs[~ok], np.full((~ok).sum(), top), 'rx', label='diverged')
  curve.axvline(result.suggestion, color='tab:green', linestyle='--',
                label=f'suggested {result.suggestion:.3g} ({result.rule})')
  curve.set_xscale('log')
  curve.set_xlabel('learning rate')
  curve.set_ylabel('training loss')
  curve.legend(fontsize=8)
  curve.grid(alpha=0.3)
  colors = plt.get_cmap('viridis')
  losses = np.asarray(result.losses, np.float64)
  for i, lr in enumerate(lrs):
    steps.plot(np.arange(1, len(losses) + 1), losses[:, i], linewidth=1,
               color=colors(i / max(len(lrs) - 1, 1)), label=f'{lr:.2g}')
  steps.set_xlabel('step')
  steps.set_title('loss per member (colour: learning rate)')
  steps.grid(alpha=0.3)
  finite = losses[np.isfinite(losses)]
  if finite.size and finite.min() > 0:
    steps.set_yscale('log')
  fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=100)
  plt.close(fig)
  write_atomic(path, png.getvalue())
  return path
