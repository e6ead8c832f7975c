"""``purax train --time-budget``: how close does a run end to its budget?

Runs ``purax train --model M --dataset digits --steps 1000000 --time-budget B``
(``--dataset pystdlib`` for ``--model lm``)
for each model (a fresh run directory each), and records the command's wall
time (measured around the process, as ``/usr/bin/time`` does), the load
average before and after (the machine may be shared), and what the run's
``verdict.json`` says (status, steps, examples seen, its own wall and
compilation seconds, the measured step time, the schedule: the steps it
decays over, whether the run reached their end, the calibration's seconds).
With ``--uncalibrated`` each model also runs with ``--decay-steps 1000000``
(the schedule spanning ``--steps``, as before the steps were planned ahead):
the final metric of both, side by side. Writes JSON (default
``benchmarks/results/time_budget.json``); asserts nothing.
Usage: ``python benchmarks/time_budget.py [--budget 60s] [--models mlp,cnn] [--uncalibrated]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from jsonout import write_json  # noqa: E402  (beside this script)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
ENV['PYTHONPATH'] = ROOT + os.pathsep + ENV.get('PYTHONPATH', '')


def one(model: str, budget: str, workdir: str, *extra: str) -> dict:
  load_before = os.getloadavg()
  began = time.perf_counter()
  dataset = 'pystdlib' if model == 'lm' else 'digits'
  out = subprocess.run([sys.executable, '-m', 'purax', 'train', '--model', model,
                        '--dataset', dataset, '--steps', '1000000', '--time-budget', budget,
                        '--workdir', workdir, '--no-progress', *extra], env=ENV, cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  wall = time.perf_counter() - began
  result = {'model': model, 'budget': budget, 'options': list(extra),
            'returncode': out.returncode,
            'wall_s': round(wall, 2), 'load_before': load_before,
            'load_after': os.getloadavg(), 'cpus': os.cpu_count()}
  if out.returncode:
    result['stderr'] = out.stderr[-2000:]
    return result
  with open(os.path.join(workdir, 'verdict.json'), encoding='utf-8') as f:
    verdict = json.load(f)
  plan = verdict['time_budget']
  result.update({
      'status': verdict['status'], 'reason': verdict['end']['reason'], 'steps': verdict['step'],
      'seen': verdict['seen'], 'metric': verdict['metric'],
      'verdict_wall_s': verdict['wall_s'], 'compile_s': verdict['compile_s'],
      'step_compile_s': plan['compile_s'], 'step_s': plan['step_s'],
      'reserve_s': plan['reserve_s'], 'replans': plan['replans'],
      'decay_steps': verdict['schedule']['decay_steps'],
      'ended_at_schedule_end': verdict['schedule']['ended_at_its_end'],
      'calibration': verdict['schedule']['planned_before_start']})
  return result


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--budget', default='60s')
  parser.add_argument('--models', default='mlp,cnn')
  parser.add_argument('--uncalibrated', action='store_true',
                      help='also run each model with its schedule spanning --steps')
  parser.add_argument('--out', default=os.path.join(ROOT, 'benchmarks', 'results',
                                                    'time_budget.json'))
  args = parser.parse_args()
  runs = []
  with tempfile.TemporaryDirectory(prefix='purax-budget-') as tmp:
    for model in args.models.split(','):
      runs.append(one(model, args.budget, os.path.join(tmp, model)))
      print(json.dumps(runs[-1]))
      if args.uncalibrated:
        runs.append(one(model, args.budget, os.path.join(tmp, model + '-uncalibrated'),
                        '--decay-steps', '1000000'))
        print(json.dumps(runs[-1]))
  write_json(args.out, {'budget': args.budget, 'runs': runs})


if __name__ == '__main__':
  main()
