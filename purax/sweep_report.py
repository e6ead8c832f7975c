"""The end of a sweep: ranking table, ``sweep.json``, ``curves.png`` (:mod:`purax.plot`), best run.

Host-side only: one transfer of the final population, then files.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import jax
import numpy as np

from purax.core import population as pop_lib

SHOWN = ('peak_learning_rate', 'weight_decay', 'b1', 'b2', 'clip_norm', 'label_smoothing')


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


def rank(scores: np.ndarray, status: np.ndarray) -> np.ndarray:
  """Member indices best first: lower score first, diverged and NaN last, stable."""
  scores = np.where(np.isfinite(scores) & (status != 'diverged'), scores, np.inf)
  return np.argsort(scores, kind='stable')


def table(rows: list[dict], metric: str) -> str:
  """A fixed-width text table of ranked members."""
  # Hyperparameters that vary across members (the learning rate always).
  varying = [c for c in SHOWN if c in rows[0] and (
      c == 'peak_learning_rate' or len({r[c] for r in rows}) > 1)]
  cols = ['rank', 'member', 'seed', *varying, 'eval_loss',
          'eval_accuracy', 'status', 'steps']
  fmt = lambda v: '-' if v is None else (f'{v:.4g}' if isinstance(v, float) else str(v))  # noqa: E731
  cells = [[fmt(r.get(c)) for c in cols] for r in rows]
  heads = [c.replace('peak_learning_rate', 'lr') for c in cols]
  widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
  line = lambda xs: '  '.join(x.rjust(w) for x, w in zip(xs, widths))  # noqa: E731
  return '\n'.join([f'members sorted by eval {metric}:', line(heads),
                    *(line(c) for c in cells)])


def save_best(config, task, sample, pop, seeds, hparams, i: int, final: dict,
              workdir: str) -> None:
  """Member ``i`` as an ordinary run that ``purax eval`` restores.

  Writes ``config.json`` (its :class:`TrainConfig`), ``member.json`` (every
  hyperparameter, b1/b2 included), ``checkpoints/`` in the format of
  :mod:`purax.runs` (``{'state', 'train_metrics'}``, an empty metrics window)
  and ``final_metrics.json``.
  """
  import jax.numpy as jnp

  from purax import runs
  from purax.io.checkpoint import Checkpointer
  os.makedirs(workdir)
  member_hp = {n: _f32(v[i]) for n, v in hparams.items()}
  member_config = config.member_config(int(seeds[i]), member_hp, workdir)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    f.write(member_config.to_json())
  with open(os.path.join(workdir, 'member.json'), 'w') as f:
    json.dump({'member': int(i), 'seed': int(seeds[i]), 'hparams': member_hp}, f, indent=2)
  abstract = runs.abstract_checkpoint(task, sample)
  tree = {'state': pop_lib.member(pop, i),
          'train_metrics': jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                        abstract['train_metrics'])}
  with Checkpointer(os.path.join(workdir, 'checkpoints'),
                    metadata=runs._metadata(member_config)) as ckpt:   # pylint: disable=protected-access
    ckpt.save(config.steps, tree)
  with open(os.path.join(workdir, 'final_metrics.json'), 'w') as f:
    json.dump({'step': config.steps, **{k: _json_number(v[i]) for k, v in final.items()}},
              f, indent=2)


def write(config, task, sample, pop, seeds, history, *, console: bool = True) -> dict:
  """Ranks the members, prints the table, writes sweep.json, curves.png and best/.

  Returns:
    The summary written to ``sweep.json``.
  """
  final = _final_eval(history)
  hparams = jax.device_get(pop_lib.get_hparams(pop.state))   # final values (after PBT)
  status = pop_lib.status(pop)
  steps = np.asarray(jax.device_get(pop.state.step))
  sign = 1.0 if config.metric == 'loss' else -1.0
  scores = sign * final.get(config.metric, np.full(len(seeds), np.nan))
  order = rank(scores, status)
  rows = []
  for r, i in enumerate(order):
    row = {'rank': r + 1, 'member': int(i), 'seed': int(seeds[i])}
    row.update({n: _f32(hparams[n][i]) for n in SHOWN if n in hparams})
    row.update({f'eval_{k}': _json_number(v[i]) for k, v in final.items()})
    row.update({'status': str(status[i]), 'steps': int(steps[i])})
    rows.append(row)
  best = int(order[0]) if status[order[0]] != 'diverged' and np.isfinite(scores[order[0]]) \
      else None
  best_dir = os.path.join(config.workdir, 'best')
  if best is not None:
    save_best(config, task, sample, pop, seeds, hparams, best, final, best_dir)
  summary = {
      'config': dataclasses.asdict(config), 'metric': config.metric,
      'members': rows,
      'best': None if best is None else {'member': best, 'workdir': best_dir},
      'history': [{k: (v if k == 'step' else [_json_number(x) for x in np.ravel(v)])
                   for k, v in rec.items()} for rec in history],
  }
  with open(os.path.join(config.workdir, 'sweep.json'), 'w') as f:
    json.dump(summary, f, indent=1)
  from purax.plot import plot_sweep_summary
  plot_sweep_summary(summary, os.path.join(config.workdir, 'curves.png'))
  if console:
    print(table(rows, config.metric))
    print(f'best member saved to {best_dir}' if best is not None
          else 'no member finished with a finite eval metric; nothing saved as best')
  return summary
