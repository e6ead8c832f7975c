"""One machine-readable verdict of a run or a sweep on a time budget:
``verdict.json`` in its directory (``--time-budget``, :class:`purax.hooks.TimeBudget`).

A run's verdict (:func:`of_run`) holds its status and end, the metric as the
run reports it (``final_metrics.json``'s evaluation), the examples (or
tokens, for a language model) it has trained on, the configuration, the
budget, the wall time this invocation used, the compilation time (left out of
the step time), the learning-rate schedule (``schedule``: the steps it
decays over, whether the run reached their end, and what was measured to
plan them before the run started, :mod:`purax.app.calibrate`) and what purax
did on its own: ``memory_fits`` (``--fit-memory``: the configuration it
chose; then each ``memory_refit`` after the step ran out of memory: the
error, the configuration that failed and the one chosen with their compiled
peaks, the budget, the step resumed from) and ``nan_diagnoses`` (the updates
skipped as non-finite and replayed, :class:`purax.hooks.NonFiniteReplay`);
both lists are empty when the run did neither.

A sweep's verdict (:func:`of_sweep`) holds the same per member and, when
members differ only in their seed, per configuration the mean and spread
(sample standard deviation) of the metric and Welch's t-test against the
baseline configuration (:func:`welch`, ``scipy.stats.ttest_ind``).

A range test's verdict (:func:`of_range`, ``purax tune lr --time-budget``)
holds its status and end, the suggestion and its rule, the grid with every
rate's losses and smoothed point (what ``lr_range.json`` holds), the
examples (or tokens) each rate trained on, the configuration, the budget, the
wall and the compilation time.

Only the writer writes it, atomically (:func:`write`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

import numpy as np

from purax.app import fit_memory
from purax.app import rundir as rundir_lib
from purax.io.checkpoint import Checkpointer
from purax.io.checkpoint import replay
from purax.io import writers

#: The verdict's file, in the run (or sweep) directory.
VERDICT = 'verdict.json'
#: The verdict's format number.
FORMAT = 1


def seen(config, steps: int) -> dict[str, int]:
  """``{'examples': n}`` trained on in ``steps`` steps, or ``{'tokens': n}``
  for text (``--model lm``: batch size times sequence length a step)."""
  data = config.data
  if data.spec.tokens:
    return {'tokens': int(steps) * data.batch_size * data.seq_len}
  return {'examples': int(steps) * data.batch_size}


def memory_fits(config, fitted_now: bool, workdir: str | None = None) -> list[dict]:
  """What ``--fit-memory`` chose (the fields it writes into the config), then
  each refit after the step ran out of memory (``workdir``'s
  ``memory_refits.json``, :func:`purax.app.fit_memory.refits`); [] for neither."""
  refits = [] if workdir is None else fit_memory.refits(workdir)
  if not config.run.fit_memory:
    return refits
  return [{'action': 'memory_fit', 'when': 'this invocation' if fitted_now else
           'when the run began (config.json keeps it)', 'remat': config.model.remat,
           'microbatches': config.optimizer.microbatches,
           'precision': config.model.precision, 'mesh': config.run.mesh,
           'memory_budget': config.run.memory_budget}] + refits


def nan_diagnoses(directory: str) -> list[dict]:
  """The reports of the updates a run replayed as non-finite and saved
  (``WORKDIR/nonfinite``, :mod:`purax.io.checkpoint.replay`), oldest first."""
  out = []
  for step in replay.saved_steps(directory):
    try:
      with Checkpointer(directory, read_only=True, interval_s=None) as ckpt:
        report = ckpt.read_extra(step).get('report', {})
    except Exception as e:   # noqa: BLE001 - a verdict names what it cannot read
      report = {'unreadable': f'{type(e).__name__}: {e}'}
    out.append({'action': 'nan_diagnosis', 'saved_step': step, **report})
  return out


def of_run(config, end, final: dict, budget, *, fitted_now: bool, replay_dir: str,
           compile_s: float, workdir: str | None = None,
           planned: dict | None = None) -> dict[str, Any]:
  """The verdict of a ``purax train`` run (the module docstring).

  Args:
    config: its :class:`purax.app.config.TrainConfig`.
    end: how it ended (:class:`purax.hooks.End`).
    final: its final evaluation (``{'loss': .., 'accuracy': ..}``), or {}.
    budget: its :class:`purax.hooks.TimeBudget`.
    fitted_now: ``--fit-memory`` fitted in this invocation.
    replay_dir: the run's ``nonfinite/`` directory.
    compile_s: the seconds this invocation spent compiling.
    workdir: the run directory, whose refits after running out of memory
      are listed (None: none).
    planned: the steps planned before the run started, in this invocation
      (:func:`purax.app.calibrate.calibrated`'s record), or None.
  """
  return {
      'format': FORMAT, 'status': end.status, 'end': end.as_dict(), 'step': end.step,
      'metric': {f'eval/{k}': writers.json_number(v) for k, v in sorted(final.items())},
      'seen': seen(config, end.step),
      'config': config.as_dict(),
      'budget_s': budget.seconds, 'wall_s': round(budget.used(), 3),
      'compile_s': round(compile_s, 3),
      'time_budget': budget.report(),
      'schedule': {'decay_steps': config.run.decay_steps or config.run.steps,
                   'ended_at_its_end': end.step >= (config.run.decay_steps or config.run.steps),
                   'planned_before_start': planned},
      'memory_fits': memory_fits(config, fitted_now, workdir),
      'nan_diagnoses': nan_diagnoses(replay_dir),
  }


def of_sweep(config, end, summary: dict | None, budget, *, compile_s: float) -> dict[str, Any]:
  """The verdict of a ``purax sweep`` on a budget (the module docstring).

  Args:
    config: its :class:`purax.app.sweep_config.SweepConfig`.
    end: how its population's run ended (:class:`purax.hooks.End`).
    summary: what ``sweep.json`` holds (:func:`purax.app.report.write`), or
      None for a sweep that was stopped (no member reported).
    budget: its :class:`purax.hooks.TimeBudget`.
    compile_s: the seconds this invocation spent compiling.
  """
  metric = config.population.metric
  rows = (summary or {}).get('members', [])
  swept = list((summary or {}).get('swept', []))
  members = []
  for r in sorted(rows, key=lambda r: r['member']):
    members.append({
        'member': r['member'], 'seed': r['seed'], 'status': r['status'], 'steps': r['steps'],
        'hparams': {k: v for k, v in r.items() if k not in _ROW_KEYS
                    and not k.startswith('eval_')},
        'metric': {f'eval/{k[len("eval_"):]}': v for k, v in r.items() if k.startswith('eval_')},
        'seen': seen(config, r['steps'])})
  seeded = len({r['seed'] for r in rows}) > 1
  baseline = config.population.baseline
  return {
      'format': FORMAT, 'status': end.status, 'end': end.as_dict(), 'step': end.step,
      'metric_name': f'eval/{metric}', 'config': config.flat(),
      'budget_s': budget.seconds, 'wall_s': round(budget.used(), 3),
      'compile_s': round(compile_s, 3), 'time_budget': budget.report(),
      'members': members, 'baseline': baseline,
      'configurations': by_configuration(rows, metric, swept, baseline) if seeded and rows
      else [],
      'memory_fits': [], 'nan_diagnoses': [],   # a sweep neither fits nor replays
  }


def of_range(config, end, result, budget, *, compile_s: float) -> dict[str, Any]:
  """The verdict of a ``purax tune lr`` range test on a budget (the module docstring).

  Args:
    config: its :class:`purax.app.tune_config.RangeConfig`.
    end: how it ended (:class:`purax.hooks.End`; ``end.step`` the steps
      every rate trained).
    result: its :class:`purax.tune.LRRange`, or None for a test that was
      stopped (no suggestion).
    budget: its :class:`purax.hooks.TimeBudget` (planned by the range test's
      loop, :mod:`purax.app.tune`).
    compile_s: the seconds this invocation spent compiling.
  """
  curve = result.as_dict() if result is not None else {}
  return {
      'format': FORMAT, 'status': end.status, 'end': end.as_dict(), 'step': end.step,
      'suggestion': curve.pop('suggestion', None), 'rule': curve.pop('rule', None),
      'curve': curve, 'seen_per_rate': seen(config, end.step), 'config': config.flat(),
      'budget_s': budget.seconds, 'wall_s': round(budget.used(), 3),
      'compile_s': round(compile_s, 3), 'time_budget': budget.report(),
      'memory_fits': [], 'nan_diagnoses': [],   # a range test neither fits nor replays
  }


#: The keys of a sweep's member row that are not hyperparameters.
_ROW_KEYS = frozenset(('rank', 'member', 'seed', 'status', 'steps'))


def welch(a: Sequence[float], b: Sequence[float]) -> dict[str, float | None]:
  """Welch's t-test of two samples' means (unequal variances), two-sided.

  Returns:
    ``{'t', 'df', 'p'}`` (``scipy.stats.ttest_ind(a, b, equal_var=False)``;
    Welch–Satterthwaite degrees of freedom); None values when either sample has
    fewer than two finite values or both have no spread.
  """
  from scipy import stats   # a dependency of jax
  a = np.asarray([x for x in a if x is not None and math.isfinite(x)], np.float64)
  b = np.asarray([x for x in b if x is not None and math.isfinite(x)], np.float64)
  none = {'t': None, 'df': None, 'p': None}
  if len(a) < 2 or len(b) < 2:
    return none
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  if va + vb == 0:
    return none
  result = stats.ttest_ind(a, b, equal_var=False)
  df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
  return {'t': float(result.statistic), 'df': float(df), 'p': float(result.pvalue)}


def by_configuration(rows: list[dict], metric: str, swept: Sequence[str],
                     baseline: int = 0) -> list[dict]:
  """Members grouped by configuration (the values of ``swept``, the seed left
  out): per configuration its members and seeds, the ``eval_METRIC`` mean and
  spread (sample std), and Welch's t-test against the configuration of member
  ``baseline`` (:func:`welch`; the baseline's own row has none).

  Args:
    rows: the sweep's member rows (``member``, ``seed``, each swept
      hyperparameter, ``eval_METRIC``).
    metric: ``'loss'`` or ``'accuracy'``.
    swept: the hyperparameters that vary across members (state names).
    baseline: the member whose configuration is the baseline.
  """
  key = lambda r: tuple(r[n] for n in swept)   # noqa: E731
  groups: dict[tuple, list[dict]] = {}
  for r in sorted(rows, key=lambda r: r['member']):
    groups.setdefault(key(r), []).append(r)
  base = key(next(r for r in rows if r['member'] == baseline))
  values = lambda g: [r.get(f'eval_{metric}') for r in g]   # noqa: E731
  out = []
  for k, group in groups.items():
    finite = np.asarray([v for v in values(group) if v is not None and math.isfinite(v)])
    out.append({
        'hparams': dict(zip(swept, k)), 'members': [r['member'] for r in group],
        'seeds': [r['seed'] for r in group], 'baseline': k == base,
        f'mean_{metric}': float(finite.mean()) if len(finite) else None,
        f'std_{metric}': float(finite.std(ddof=1)) if len(finite) > 1 else None,
        'welch_vs_baseline': None if k == base else welch(values(group), values(groups[base])),
    })
  return out


def write(path: str, verdict: dict) -> None:
  """Writes ``verdict`` to ``path`` atomically (JSON, no NaN: non-finite numbers
  as strings, as ``metrics.jsonl``)."""
  rundir_lib.write_atomic(path, json.dumps(verdict, indent=2, allow_nan=False,
                                           default=_json_default))


def read(path: str) -> dict:
  """The verdict at ``path`` (a directory's :data:`VERDICT` when ``path`` is one)."""
  if os.path.isdir(path):
    path = os.path.join(path, VERDICT)
  with rundir_lib.open_file(path, encoding='utf-8') as f:
    return json.load(f)


def _json_default(value):
  if isinstance(value, (np.integer,)):
    return int(value)
  if isinstance(value, (np.floating,)):
    return writers.json_number(float(value))
  raise TypeError(f'{type(value).__name__} is not JSON')
