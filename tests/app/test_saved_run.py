"""purax.open_run (purax/app/saved_run.py): a run trained by the command line,
opened in Python read-only; its predictions and evaluation are what the
command line gives."""

import json
import os

import numpy as np
import pytest

import purax
from tests.helpers_runs import purax as purax_cli


def test_a_cli_run_opened_in_python_predicts_and_evaluates_as_purax_eval(tmp_path):
  workdir = str(tmp_path / 'run')
  done = purax_cli('train', '--model', 'mlp', '--steps', '30', '--batch-size', '32',
                   '--eval-every', '10', '--keep-best', '1', '--best-metric', 'eval/loss',
                   '--best-mode', 'max', '--no-progress', '--workdir', workdir)
  assert done.returncode == 0, done.stderr[-2000:]
  before = sorted(os.listdir(os.path.join(workdir, 'checkpoints')))
  run = purax.open_run(workdir)
  assert run.step == 30 and run.end.status == 'finished' and run.config.run.steps == 30
  logits = np.asarray(run.predict(run.data.x_test[:8]))
  assert logits.shape == (8, run.data.num_classes) and logits.dtype == np.float32
  cli = json.loads(purax_cli('eval', '--workdir', workdir).stdout.splitlines()[-1])['eval']
  assert run.evaluate() == pytest.approx(cli, rel=1e-6)
  accuracy = float(np.mean(np.asarray(run.predict(run.data.x_test)).argmax(-1)
                           == run.data.y_test))
  assert accuracy == pytest.approx(cli['accuracy'], abs=1e-6)
  best = purax.open_run(workdir, best=True)        # the highest eval loss: the first evaluation
  assert best.step == 10 and best.end is None
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == before   # read only


def test_open_run_names_what_is_not_a_run(tmp_path):
  with pytest.raises(purax.ConfigError, match=r"workdir: expected a purax train run directory "
                                              r"\(with config.json\), got '.*nowhere'"):
    purax.open_run(str(tmp_path / 'nowhere'))
  with pytest.raises(purax.ConfigError, match='best: expected True or False'):
    purax.open_run(str(tmp_path), best='yes')

