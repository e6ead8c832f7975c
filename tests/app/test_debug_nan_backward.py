"""``purax debug-nan`` on a NaN made in the backward pass only (a sqrt at 0 in
one module of one layer of a scanned stack): the run skips the update, and
the replay, in a fresh process, names that module and its layer."""

import json

import numpy as np
import pytest

from purax.app import cli
from purax.io.checkpoint import replay
from tests.helpers_runs import purax
from tests.scripts.backward_nan_net import BAD, LAYERS, MARK


@pytest.mark.slow
def test_debug_nan_names_the_module_and_layer_whose_backward_pass_made_the_nan(tmp_path):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(32, 6)).astype(np.float32)
  x[5, 0] = 2 * MARK          # this example's backward pass makes a NaN in layer BAD
  np.savez(tmp_path / 'd.npz', x_train=x, y_train=rng.integers(0, 3, 32),
           x_test=rng.normal(size=(8, 6)).astype(np.float32), y_test=rng.integers(0, 3, 8))
  workdir = str(tmp_path / 'run')
  assert cli.main(['train', '--dataset', f'npz:{tmp_path / "d.npz"}',
                   '--model', 'tests.scripts.backward_nan_net:make_net', '--steps', '4',
                   '--batch-size', '8', '--log-every', '2', '--eval-every', '0',
                   '--no-progress', '--debug-nans', '--workdir', workdir]) == 0
  steps = replay.saved_steps(str(tmp_path / 'run' / 'nonfinite'))
  assert len(steps) == 1, steps
  done = purax('debug-nan', '--workdir', workdir, '--step', str(steps[0]))
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  assert out['replayed'] == out['saved']
  report = out['replayed']
  assert (report['where'], report['path']) == ('backward', 'layers/root'), report
  assert f'layer {BAD} of 0..{LAYERS - 1}' in report['detail'], report['detail']
