"""Random SIGKILLs against ``purax train``: does the run end as if never killed?

Trains a reference run straight, then the same run killed ``--kills`` times
with SIGKILL at random moments and resumed each time (the same command), and
compares:

- the final checkpoint (params, optimizer state, rng, metrics window): bitwise;
- ``metrics.jsonl``: every record of the straight run, in order, bitwise in
  every value but the timings (``purax.io.writers.TIMINGS``: ``time``,
  ``steps_per_sec``, ``compile_s``; no record lost, none doubled).

Kill moments: some during start-up (a random delay after launch, before the
first checkpoint or while loading and compiling), the others right after a
random step is logged; with ``--checkpoint-every`` equal to ``--log-every``
that is the moment a save starts, so many kills land during an asynchronous
save. Writes JSON (default ``benchmarks/results/sigkill.json``); asserts
nothing. Usage: ``python benchmarks/sigkill.py [--kills 20] [--seed 0]``
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import signal
import subprocess
import sys
import time

from purax.io import writers
from jsonout import write_json  # noqa: E402  (beside this script)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
ENV['PYTHONPATH'] = ROOT + os.pathsep + ENV.get('PYTHONPATH', '')


def records(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [{k: v for k, v in json.loads(l).items() if k not in writers.TIMINGS}
            for l in f if l.strip()]


def last_logged_step(workdir):
  try:
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      lines = [l for l in f if l.strip()]
    return json.loads(lines[-1])['step'] if lines else 0
  except (OSError, ValueError, KeyError):
    return 0


def final_state(workdir):
  """The newest checkpoint's arrays as numpy, keyed by path (typed keys as key data)."""
  import jax
  import numpy as np
  from purax.app import job as job_lib
  from purax.app.rundir import read_config
  from purax.io.checkpoint import Checkpointer
  abstract = job_lib.build(read_config(workdir).validate(), mesh=False).abstract
  with Checkpointer(os.path.join(workdir, 'checkpoints')) as ckpt:
    tree, _, step = ckpt.restore(abstract)
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return step, {jax.tree_util.keystr(p): np.asarray(
      jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
                for p, x in leaves}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--kills', type=int, default=20)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--steps', type=int, default=400)
  parser.add_argument('--startup-kills', type=int, default=4,
                      help='how many of the kills come at a random delay after launch')
  parser.add_argument('--workdir', default='/tmp/purax-sigkill')
  parser.add_argument('--out', default=os.path.join(ROOT, 'benchmarks', 'results',
                                                    'sigkill.json'))
  args = parser.parse_args()
  import shutil
  shutil.rmtree(args.workdir, ignore_errors=True)
  os.makedirs(args.workdir)
  train = ['--model', 'mlp', '--steps', str(args.steps), '--batch-size', '32',
           '--log-every', '10', '--checkpoint-every', '10', '--eval-every', '50',
           '--dropout-rate', '0.1', '--no-progress']
  reference, killed = (os.path.join(args.workdir, n) for n in ('reference', 'killed'))
  cmd = lambda w: [sys.executable, '-m', 'purax', 'train', *train, '--workdir', w]
  start = time.time()
  done = subprocess.run(cmd(reference), cwd=ROOT, env=ENV, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]

  rng = random.Random(args.seed)
  targets = sorted(rng.sample(range(20, args.steps - 10, 10),
                              args.kills - args.startup_kills))
  plan = [('after_seconds', rng.uniform(0.5, 6.0)) for _ in range(args.startup_kills)]
  plan += [('after_step', t) for t in targets]
  kills = []
  for kind, when in plan:
    proc = subprocess.Popen(cmd(killed), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    launched = time.time()
    while proc.poll() is None:
      if kind == 'after_seconds' and time.time() - launched >= when:
        break
      if kind == 'after_step' and last_logged_step(killed) >= when:
        break
      time.sleep(0.005)
    if proc.poll() is not None:
      kills.append({'kind': kind, 'when': when, 'outcome': f'exited {proc.returncode} first',
                    'stderr': proc.stderr.read()[-500:]})
      continue
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    committed = sorted(int(os.path.basename(p)) for p in glob.glob(
        os.path.join(killed, 'checkpoints', '[0-9]*')) if os.path.basename(p).isdigit())
    kills.append({'kind': kind, 'when': round(when, 3),
                  'last_logged_step': last_logged_step(killed),
                  'committed_checkpoints': committed,
                  'in_progress_save': bool(glob.glob(os.path.join(
                      killed, 'checkpoints', '*orbax-checkpoint-tmp*')))})
  done = subprocess.run(cmd(killed), cwd=ROOT, env=ENV, capture_output=True, text=True)
  finish_ok = done.returncode == 0

  step_a, a = final_state(reference)
  step_b, b = final_state(killed)
  import numpy as np
  differing = [k for k in a if k not in b or not np.array_equal(a[k], b[k])]
  rec_a, rec_b = records(reference), records(killed)
  result = {
      'kills': sum('last_logged_step' in k for k in kills),
      'kills_during_a_save': sum(bool(k.get('in_progress_save')) for k in kills),
      'final_run_exit_status': done.returncode,
      'final_step': [step_a, step_b],
      'final_state_bitwise_equal': finish_ok and step_a == step_b and not differing
                                   and set(a) == set(b),
      'differing_leaves': differing[:10],
      'metrics_records': [len(rec_a), len(rec_b)],
      'metrics_jsonl_complete_and_equal': rec_a == rec_b,
      'unreadable_moved_aside': sorted(os.path.basename(p) for p in glob.glob(
          os.path.join(killed, 'checkpoints', '*unreadable*'))),
      'seconds': round(time.time() - start, 1),
      'seed': args.seed, 'steps': args.steps, 'plan': kills,
  }
  write_json(args.out, result, say=False)
  print(json.dumps({k: v for k, v in result.items() if k != 'plan'}))
  if not finish_ok:
    print(done.stderr[-3000:], file=sys.stderr)


if __name__ == '__main__':
  main()
