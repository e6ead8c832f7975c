"""Your own model, loss and data set on the command line: `purax train --model
mynets:make_net` (examples/mynets.py) trains, resumes, evaluates and exports like a
built-in model; the run's config.json records the import paths, so `purax eval
--workdir` imports them again. `PURAX_EXAMPLE_TINY=1`: a few steps."""
import json
import os
import subprocess
import sys
import tempfile

STEPS = 8 if os.environ.get('PURAX_EXAMPLE_TINY') else 400
HERE = os.path.dirname(os.path.abspath(__file__))
# The module must be importable: its directory on PYTHONPATH (or be the current one).
ENV = {**os.environ, 'PYTHONPATH': os.pathsep.join([HERE, os.environ.get('PYTHONPATH', '')])}


def purax(*args: str) -> dict:
  """`purax ARGS` (as `python -m purax`): the JSON line it prints last."""
  done = subprocess.run([sys.executable, '-m', 'purax', *args], env=ENV, text=True,
                        capture_output=True)
  if done.returncode != 0:
    sys.exit(f'purax {" ".join(args)}: exit status {done.returncode}\n{done.stderr}')
  return json.loads(done.stdout.splitlines()[-1])


workdir = os.path.join(tempfile.mkdtemp(), 'blobs')
common = ['--no-progress', '--log-every', '4', '--eval-every', '4', '--batch-size', '32']
purax('train', '--model', 'mynets:make_net', '--dropout-rate', '0.2', '--loss', 'mynets:focal',
      '--dataset', 'mynets:blobs', '--steps', str(STEPS // 2), '--workdir', workdir, *common)
purax('train', '--workdir', workdir, '--steps', str(STEPS))                  # resume
metrics = purax('eval', '--workdir', workdir)['eval']
exported = purax('export', '--workdir', workdir)['exported']
with open(os.path.join(workdir, 'config.json')) as f:
  config = json.load(f)
print(f"cli_own_model: {config['model']['name']} (loss {config['data']['loss']}, data "
      f"{config['data']['name']}) trained to step {STEPS} after a resume, eval accuracy "
      f"{metrics['accuracy']:.3f}, exported {os.path.basename(exported)}")
