"""``purax train --debug-nans`` replays a skipped update and saves it; ``purax
debug-nan`` replays the saved update in a fresh process to the same report."""

import json

import numpy as np
import pytest

from purax.app import cli
from purax.io.checkpoint import replay
from tests.helpers_runs import purax


@pytest.mark.slow
def test_a_skipped_update_of_a_run_replays_in_a_fresh_process(tmp_path, capsys):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(32, 6)).astype(np.float32)
  x[5, :] = 3e38          # finite, but the first layer's output overflows to inf
  np.savez(tmp_path / 'd.npz', x_train=x, y_train=rng.integers(0, 3, 32),
           x_test=rng.normal(size=(8, 6)).astype(np.float32), y_test=rng.integers(0, 3, 8))
  workdir = str(tmp_path / 'run')
  assert cli.main(['train', '--dataset', f'npz:{tmp_path / "d.npz"}', '--model', 'mlp',
                   '--steps', '4', '--batch-size', '8', '--log-every', '2', '--eval-every', '0',
                   '--no-progress', '--debug-nans', '--workdir', workdir]) == 0
  assert replay.saved_steps(str(tmp_path / 'run' / 'nonfinite')) == [2]
  done = purax('debug-nan', '--workdir', workdir, '--step', '2')
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  assert out['replayed'] == out['saved']
  assert (out['replayed']['step'], out['replayed']['where'], out['replayed']['path']) == (
      2, 'forward', 'Dense_0')
  assert 'purax: non-finite update at state.step=2: forward: Dense_0: its output' in done.stderr
  capsys.readouterr()
  assert cli.main(['debug-nan', '--workdir', workdir, '--step', '3']) == 2
  assert 'step: expected a saved update, one of [2], got 3' in capsys.readouterr().err
