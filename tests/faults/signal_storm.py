"""Sends SIGTERM/SIGINT at random moments to every `purax` command and writes
a JSON summary: per trial the command, the signal(s), the moment (seconds
after the start, and its share of an uninterrupted run's time), the exit
status, the status printed, and whether it crashed (a negative status, a
traceback, a segmentation fault), printed a status other than its exit, or
left a half-written output. Not part of the suite (minutes):

  python tests/faults/signal_storm.py --signals 20 --out storm.json [--seed 0]
"""

import argparse
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.helpers_signals import CRASH, SWEEP, TINY, TUNE  # noqa: E402
from tests.helpers_runs import ENV  # noqa: E402


def prepare(d):
  """The runs the commands read (as the suite's fixture builds them)."""
  code = ('import sys, pathlib; from tests import helpers_signals as t; '
          't.make_runs(pathlib.Path(sys.argv[1]))')
  subprocess.run([sys.executable, '-c', code, d], cwd=ROOT, env=ENV, check=True,
                 capture_output=True)


def commands(d, out):
  return {
      'train': ['train', *TINY, '--steps', '60', '--log-every', '10', '--workdir', f'{out}/w'],
      'sweep': [*SWEEP[:-6], '--steps', '60', '--log-every', '10', '--eval-every', '0',
                '--workdir', f'{out}/w'],
      'tune lr': [*TUNE[:-4], '--steps', '60', '--num-lrs', '3', '--workdir', f'{out}/w'],
      'eval': ['eval', '--workdir', f'{d}/run'],
      'export': ['export', '--workdir', f'{d}/run', '--out', f'{out}/export'],
      'generate': ['generate', '--workdir', f'{d}/lm', '--prompt', 'def ',
                   '--max-new-tokens', '16'],
      'debug-nan': ['debug-nan', '--workdir', f'{d}/run'],
      'plot': ['plot', '--workdir', f'{d}/run', '--out', f'{out}/curves.png'],
  }


def run(args, signals=(), at=0.0, gap=0.3):
  proc = subprocess.Popen([sys.executable, '-m', 'purax', *args], cwd=ROOT, env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  start, sent = time.monotonic(), 0
  try:
    out, err = proc.communicate(timeout=at) if signals else proc.communicate(timeout=600)
  except subprocess.TimeoutExpired:
    for i, s in enumerate(signals):
      if i:
        time.sleep(gap)
      if proc.poll() is None:
        proc.send_signal(s)
        sent += 1
    out, err = proc.communicate(timeout=600)
  return proc.returncode, out, err, time.monotonic() - start, sent


def half_written(name, out):
  """What an output that is neither absent nor complete looks like, or ''."""
  leftovers = [p for p in os.listdir(out) if '.partial-' in p or '.replaced-' in p
               or p.endswith('.tmp')]
  if leftovers:
    return f'leftovers {leftovers}'
  try:
    if name == 'export' and os.path.exists(f'{out}/export'):
      subprocess.run([sys.executable, '-c', 'import sys; from purax.io import export; '
                      'export.load_predict(sys.argv[1])', f'{out}/export'], cwd=ROOT, env=ENV,
                     check=True, capture_output=True)
    if name == 'plot' and os.path.exists(f'{out}/curves.png'):
      with open(f'{out}/curves.png', 'rb') as f:
        assert f.read(4) == b'\x89PNG'
    for result in ('sweep.json', 'lr_range.json', 'final_metrics.json'):
      if os.path.exists(f'{out}/w/{result}'):
        with open(f'{out}/w/{result}') as f:
          json.load(f)
  except Exception as e:   # noqa: BLE001 - any failure to read it back is the finding
    return f'{type(e).__name__}: {e}'[:200]
  return ''


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--signals', type=int, default=20)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out', default='signal_storm.json')
  parser.add_argument('--only', nargs='*')
  flags = parser.parse_args()
  rng = random.Random(flags.seed)
  trials, base = [], tempfile.mkdtemp(prefix='storm-')
  prepare(base)
  for name, args in commands(base, '{out}').items():
    if flags.only and name not in flags.only:
      continue
    clean = tempfile.mkdtemp(dir=base)
    rc, _, err, full, _ = run([a.replace('{out}', clean) for a in args])
    assert rc == 0, (name, err[-2000:])
    for i in range(flags.signals):
      out = tempfile.mkdtemp(dir=base)
      sigs = [rng.choice([signal.SIGTERM, signal.SIGINT])]
      if rng.random() < 0.2:
        sigs.append(rng.choice([signal.SIGTERM, signal.SIGINT]))
      at = rng.uniform(0.2, full * 0.95)
      rc, stdout, err, _, sent = run([a.replace('{out}', out) for a in args], sigs, at)
      printed = [int(s) for s in re.findall(r'exit status (\d+)', err)]
      crash = rc < 0 or any(c in err for c in CRASH)
      trial = {'command': name, 'signals': [signal.Signals(s).name for s in sigs[:sent]],
               'moment_s': round(at, 2), 'moment_share': round(at / full, 2),
               'exit_status': rc, 'printed_status': printed[0] if len(printed) == 1 else printed
               or None, 'said': (err.strip().splitlines() or [''])[-1][:160],
               'crash': crash,
               'status_mismatch': (printed != [rc]) if printed else rc != 0,
               'half_written': half_written(name, out)}
      if crash:
        trial['stderr_tail'] = err[-1500:]
      trials.append(trial)
      print(json.dumps(trial), flush=True)
  summary = collections.OrderedDict()
  for t in trials:
    s = summary.setdefault(t['command'], collections.Counter())
    s['trials'] += 1
    s['signalled'] += bool(t['signals'])
    s[f"exit {t['exit_status']}"] += 1
    s['crash'] += t['crash']
    s['status_mismatch'] += t['status_mismatch']
    s['half_written'] += bool(t['half_written'])
  with open(flags.out, 'w') as f:
    json.dump({'summary': summary, 'trials': trials}, f, indent=1)
  print(json.dumps(summary, indent=1))


if __name__ == '__main__':
  main()
