"""The end of a sweep: ranking table, ``sweep.json``, ``curves.png``, best run.

Host-side only: one transfer of the final population, then files. The table
and the plot name every swept hyperparameter (any that differs across
members, with :data:`purax.app.hparam_table.HPARAMS`' short names, a user's own
loss hyperparameter under its own name).
"""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from purax.app import hparam_table as hparams_lib
from purax.app import job as job_lib
from purax.app import plot
from purax.app import rundir as rundir_lib
from purax.core import hparams as core_hparams
from purax.core import metrics as metrics_lib
from purax.core import population as pop_lib
from purax.io.checkpoint import Checkpointer


def _json_number(v):
  v = float(v)
  return v if math.isfinite(v) else None


def _f32(v) -> float:
  """A float32 as the shortest Python float that rounds back to it (readable JSON)."""
  return float(str(np.float32(v)))


def _final_eval(history) -> dict[str, np.ndarray]:
  records = [r for r in history if any(k.startswith('eval/') for k in r)]
  return {k[len('eval/'):]: np.asarray(v) for k, v in records[-1].items()
          if k.startswith('eval/')} if records else {}


def swept(hparams) -> tuple[str, ...]:
  """State names of the hyperparameters whose values differ across members,
  in the table's order (then any other, e.g. a user's loss hyperparameter)."""
  varying = [n for n, v in hparams.items() if len(np.unique(np.asarray(v))) > 1]
  return tuple(sorted(varying, key=hparams_lib.order))


def rank(scores: np.ndarray, status: np.ndarray) -> np.ndarray:
  """Member indices best first: lower score first, diverged and NaN last, stable."""
  scores = np.where(np.isfinite(scores) & (status != 'diverged'), scores, np.inf)
  return np.argsort(scores, kind='stable')


def table(rows: list[dict], metric: str, columns=()) -> str:
  """A fixed-width text table of ranked members, with a column for each of
  ``columns`` (state names; the learning rate always) and for the seed."""
  shown = list(dict.fromkeys(['learning_rate', *columns]))
  shown = [c for c in shown if c in rows[0]]
  cols = ['rank', 'member', 'seed', *shown, 'eval_loss', 'eval_accuracy', 'status', 'steps']
  fmt = lambda v: '-' if v is None else (f'{v:.4g}' if isinstance(v, float) else str(v))  # noqa: E731
  cells = [[fmt(r.get(c)) for c in cols] for r in rows]
  heads = [hparams_lib.label(c) for c in cols]
  widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
  line = lambda xs: '  '.join(x.rjust(w) for x, w in zip(xs, widths))  # noqa: E731
  return '\n'.join([f'members sorted by eval {metric}:', line(heads),
                    *(line(c) for c in cells)])


def save_best(config, job, pop, seeds, hparams, i: int, final: dict, workdir: str,
              reached: int | None = None) -> None:
  """Member ``i`` as an ordinary run that ``purax eval`` restores and
  ``purax train --workdir`` continues.

  Writes ``config.json`` (its :class:`purax.app.config.TrainConfig`: its seed
  and every hyperparameter), ``member.json``, ``checkpoints/`` in the format of
  ``purax train`` (``{'state', 'train_metrics'}``, an empty metrics window)
  and ``final_metrics.json``, at step ``reached`` (default ``--steps``; less
  when a ``--time-budget`` ended the sweep).
  """
  reached = config.run.steps if reached is None else reached
  os.makedirs(workdir)
  member_hp = {n: _f32(v[i]) for n, v in hparams.items()}
  member_config = config.base(member_hp, seed=int(seeds[i]), workdir=workdir)
  rundir_lib.write_atomic(os.path.join(workdir, 'config.json'), member_config.to_json())
  rundir_lib.write_atomic(os.path.join(workdir, 'member.json'), json.dumps(
      {'member': int(i), 'seed': int(seeds[i]), 'hparams': member_hp}, indent=2))
  tree = {'state': pop_lib.member(pop, i),
          'train_metrics': jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                        job.abstract['train_metrics'])}
  with Checkpointer(os.path.join(workdir, 'checkpoints'), metadata=job_lib.metadata(
      member_config, job.sample, job.num_classes)) as ckpt:
    ckpt.save(reached, tree)
  rundir_lib.write_atomic(os.path.join(workdir, 'final_metrics.json'), json.dumps(
      {'step': reached, **{k: _json_number(v[i]) for k, v in final.items()}},
      indent=2))


def write(config, job, pop, seeds, history, *, console: bool = True,
          reached: int | None = None) -> dict:
  """Ranks the members, prints the table, writes sweep.json, curves.png and best/.

  Returns:
    The summary written to ``sweep.json``: ``config`` (flat names),
    ``swept`` (state names), ``members`` (ranked rows: seed, every
    hyperparameter, eval metrics, status), ``best``, ``history``.
  """
  final = _final_eval(history)
  hparams = jax.device_get(core_hparams.get(pop.state))   # final values (after PBT)
  status = pop_lib.status(pop)
  steps = np.asarray(jax.device_get(pop.state.step))
  metric = config.population.metric
  scores = metrics_lib.to_minimise(final.get(metric, np.full(len(seeds), np.nan)),
                                   config.population.best().mode)
  order = rank(scores, status)
  columns = swept(hparams)
  rows = []
  for r, i in enumerate(order):
    row = {'rank': r + 1, 'member': int(i), 'seed': int(seeds[i])}
    row.update({n: _f32(v[i]) for n, v in hparams.items()})
    row.update({f'eval_{k}': _json_number(v[i]) for k, v in final.items()})
    row.update({'status': str(status[i]), 'steps': int(steps[i])})
    rows.append(row)
  best = int(order[0]) if status[order[0]] != 'diverged' and np.isfinite(scores[order[0]]) \
      else None
  best_dir = os.path.join(config.run.workdir, 'best')
  if best is not None:
    save_best(config, job, pop, seeds, hparams, best, final, best_dir, reached)
  summary = {
      'config': config.flat(), 'metric': metric, 'swept': list(columns),
      'members': rows,
      'best': None if best is None else {'member': best, 'workdir': best_dir},
      'history': [{k: (v if k == 'step' else [_json_number(x) for x in np.ravel(v)])
                   for k, v in rec.items()} for rec in history],
  }
  plot.plot_sweep_summary(summary, os.path.join(config.run.workdir, 'curves.png'))
  # Last: a sweep directory with sweep.json is finished (purax.app.sweep.run).
  rundir_lib.write_atomic(os.path.join(config.run.workdir, 'sweep.json'),
                          json.dumps(summary, indent=1))
  if console:
    print(table(rows, metric, columns))
    print(f'best member saved to {best_dir}' if best is not None
          else 'no member finished with a finite eval metric; nothing saved as best')
  return summary
