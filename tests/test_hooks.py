"""Hooks at log/eval points: early stopping's best score and patience counter
survive a restart in a fresh process."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'tests', 'scripts', 'early_stopping_run.py')


def run(directory, stop_at):
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='')
  out = subprocess.run([sys.executable, SCRIPT, str(directory), str(stop_at)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_early_stopping_state_survives_a_restart_in_a_fresh_process(tmp_path):
  straight = run(tmp_path / 'straight', 0)
  assert straight == 'final step 8 stale 3'     # evals at 2 (best), 4, 6, 8 (3 stale)
  assert run(tmp_path / 'split', 6) == 'final step 6 stale 2'
  # A fresh process: without the saved counter it would run on to step 12.
  assert run(tmp_path / 'split', 0) == straight
