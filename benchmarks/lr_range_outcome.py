"""The learning-rate range test judged by outcome: is the suggested rate as good
as the best rate of its grid, at the test's budget and three times longer?

For each row (a model on a bundled data set, the job ``purax tune lr`` would
build; warmup a tenth of the steps):

1. the range test, :class:`purax.tune.lr_range.RangeTest`, every rate of the
   grid trained ``steps`` steps from one initial state (seed 0) in one
   compiled program; each rule of :data:`purax.tune.RULES` suggests a rate
   from its curve (each a rate of the grid: the grid has three rates a decade,
   so ``'minimum'``'s tenth of a rate is one too);
2. each member's final state is evaluated on the eval split: the grid's eval
   loss at the test's own budget, and so each rule's, since each suggests a
   member (the best-grid rate: the member of least eval loss);
3. the grid is trained again for ``3 * steps`` (a job of that many steps: its
   warmup and decay span them, as ``purax train --steps`` would) and
   evaluated the same way.

A rule is within 10% on a row when its rate's eval loss is at most 1.1 times
the best-grid eval loss, at each budget. The rows are small for a shared
CPU (the ResNet and LM rows train fewer steps, and the LM evaluates its first
eval batches only); the numbers are what they measured, nothing is tuned
per row. Writes ``--out`` (default
``benchmarks/measured/cpu_s21/lr_range_outcome.json``); asserts nothing.

Usage: ``PYTHONPATH=. nice python benchmarks/lr_range_outcome.py [--rows mlp-digits,...]``;
``--table lowest`` prints the README's table of a rule from the JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import time

import jax
import numpy as np

from purax import tune
from purax.app import job as job_lib
from purax.app.config import TrainConfig
from purax.core import population as pop_lib
from purax.tune import lr_range
from jsonout import write_json  # noqa: E402  (beside this script)

LM = dict(seq_len=64, d_model=64, num_layers=2, num_heads=4)

#: name -> (flat config, range-test steps, eval batches (None: all)).
ROWS = {
    'mlp-digits': (dict(model='mlp', dataset='digits', batch_size=32), 100, None),
    'cnn-digits': (dict(model='cnn', dataset='digits', batch_size=32), 100, None),
    'resnet-digits': (dict(model='resnet', dataset='digits', batch_size=32), 60, None),
    'mlp-mnist1d': (dict(model='mlp', dataset='mnist1d', batch_size=32), 100, None),
    'cnn-mnist1d': (dict(model='cnn', dataset='mnist1d', batch_size=32), 100, None),
    'resnet-mnist1d': (dict(model='resnet', dataset='mnist1d', batch_size=32), 60, None),
    'lm-pystdlib': (dict(model='lm', dataset='pystdlib', batch_size=8, **LM), 60, 8),
}
GRID = dict(min_lr=1e-4, max_lr=1.0, num=13)      # three rates a decade
STRATEGY = 'vmap'


def build(flat: dict, steps: int):
  config = TrainConfig.of(**flat, steps=steps, warmup_steps=steps // 10,
                          progress=False).validate().resolved()
  return job_lib.build(config, mesh=False)


def eval_losses(job, pop, eval_batches) -> np.ndarray:
  """Each member's eval loss, float64 ``[members]`` (NaN: non-finite)."""
  batches = job.data.eval(job.config.data.eval_batch_size)
  batches = list(batches if eval_batches is None else itertools.islice(batches, eval_batches))
  acc = pop_lib.zero_eval_metrics(job.task, pop, batches[0])
  for batch in batches:
    acc = pop_lib.eval_step(job.task, pop, acc, batch, strategy=STRATEGY)
  loss = jax.device_get(acc['loss'])
  return np.asarray(loss.total, np.float64) / np.asarray(loss.count, np.float64)


def train_grid(job, lrs, steps: int):
  """The grid trained ``steps`` steps from seed 0's state, as the range test does."""
  test = lr_range.RangeTest(job.task, job.init(0), lrs=lrs, steps=steps, strategy=STRATEGY)
  for s in range(steps):
    test.step(job.train_data[s])
  return test


def judged(lrs, evals, rate) -> dict:
  finite = np.where(np.isfinite(evals), evals, np.inf)
  best = int(np.argmin(finite))
  i = int(np.argmin(np.abs(np.log(lrs) - np.log(rate))))
  return {'rate': float(rate), 'grid_rate': float(lrs[i]), 'eval_loss': float(evals[i]),
          'best_grid_rate': float(lrs[best]), 'best_eval_loss': float(finite[best]),
          'ratio': float(evals[i] / finite[best]),
          'within_10pct': bool(evals[i] <= 1.1 * finite[best])}


def row(name: str) -> dict:
  flat, steps, eval_batches = ROWS[name]
  begin = time.process_time()
  lrs = tune.log_grid(GRID['min_lr'], GRID['max_lr'], GRID['num'])
  job = build(flat, steps)
  test = train_grid(job, lrs, steps)
  out = {'config': flat, 'steps': steps, 'steps_long': 3 * steps, 'lrs': [float(v) for v in lrs],
         'eval_batches': eval_batches}
  try:
    result = test.result()
  except lr_range.RangeTestError as e:
    out['error'] = str(e)
    return out
  out['curve'] = {'smoothed': [float(v) if np.isfinite(v) else str(v) for v in result.smoothed],
                  'diverged': [bool(v) for v in result.diverged], 'window': result.window}
  suggestions = {rule: result.suggest(rule) for rule in tune.RULES}
  evals = eval_losses(job, test.pop, eval_batches)
  long_job = build(flat, 3 * steps)
  long_evals = eval_losses(long_job, train_grid(long_job, lrs, 3 * steps).pop, eval_batches)
  out['eval_loss'] = {'budget': [float(v) for v in evals], 'long': [float(v) for v in long_evals]}
  out['rules'] = {rule: {'budget': judged(lrs, evals, rate), 'long': judged(lrs, long_evals, rate)}
                  for rule, rate in suggestions.items()}
  out['cpu_s'] = time.process_time() - begin
  return out


def table(path: str, rule: str) -> str:
  """The markdown table of ``rule`` on every row of the JSON at ``path``."""
  with open(path, encoding='utf-8') as f:
    rows = json.load(f)['rows']
  lines = ['| row | steps | suggested | best-grid rate | eval loss: suggested / best | within 10% '
           '| 3x steps: best-grid rate | eval loss: suggested / best | within 10% |',
           '|' + '---|' * 9]
  for name, r in rows.items():
    if 'rules' not in r:
      lines.append(f"| {name} | {r['steps']} | {r['error']} |" + ' |' * 6)
      continue
    b, l = r['rules'][rule]['budget'], r['rules'][rule]['long']
    yes = lambda v: 'yes' if v else '**no**'   # noqa: E731
    lines.append(f"| {name} | {r['steps']} | {b['rate']:.3g} | {b['best_grid_rate']:.3g} | "
                 f"{b['eval_loss']:.3f} / {b['best_eval_loss']:.3f} | {yes(b['within_10pct'])} | "
                 f"{l['best_grid_rate']:.3g} | {l['eval_loss']:.3f} / {l['best_eval_loss']:.3f} | "
                 f"{yes(l['within_10pct'])} |")
  return '\n'.join(lines)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--rows', default=','.join(ROWS), help='comma-separated, of: ' + ', '.join(ROWS))
  p.add_argument('--out', default='benchmarks/measured/cpu_s21/lr_range_outcome.json')
  p.add_argument('--table', metavar='RULE', help='print the markdown table of RULE from --out '
                 'and train nothing')
  args = p.parse_args()
  if args.table:
    print(table(args.out, args.table))
    return
  device = jax.devices()[0]
  out = {'platform': device.platform, 'device_kind': device.device_kind, 'jax': jax.__version__,
         'host': platform.node(), 'grid': GRID, 'strategy': STRATEGY,
         'command': 'PYTHONPATH=. nice python benchmarks/lr_range_outcome.py', 'rows': {}}
  for name in args.rows.split(','):
    out['rows'][name] = row(name)
    r = out['rows'][name]
    if 'rules' in r:
      print(name, f"{r['cpu_s']:.0f} cpu s", {k: (f"{v['budget']['rate']:.3g}",
                                                   v['budget']['within_10pct'],
                                                   v['long']['within_10pct'])
                                               for k, v in r['rules'].items()}, flush=True)
    else:
      print(name, r['error'], flush=True)
    write_json(args.out, out, say=False)     # after each row: a cut-short run keeps its rows
  print(f'wrote {args.out}')


if __name__ == '__main__':
  main()
