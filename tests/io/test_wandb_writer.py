"""purax.io.wandb_writer: imported only when asked; offline by default.

The first tests run against a stand-in ``wandb`` module (the suite's
environment need not have wandb); the last runs the real package in offline
mode when it is installed (``pip install 'purax[wandb]'``).
"""

import glob
import os
import sys
import types

import pytest

from purax.core.errors import ConfigError
from purax.io import writers


class FakeRun:
  def __init__(self, **kwargs):
    self.init_kwargs, self.logged, self.finished = kwargs, [], False
    self.config = types.SimpleNamespace(values=dict(kwargs['config']))
    self.config.update = lambda d, allow_val_change=False: self.config.values.update(d)

  def log(self, data, step):
    self.logged.append((step, data))

  def finish(self):
    self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
  module = types.ModuleType('wandb')
  module.runs = []
  module.init = lambda **kw: module.runs.append(FakeRun(**kw)) or module.runs[-1]
  monkeypatch.setitem(sys.modules, 'wandb', module)
  monkeypatch.delenv('WANDB_MODE', raising=False)
  return module


def test_writes_scalars_hparams_and_finishes_offline_by_default(fake_wandb, tmp_path):
  from purax.io.wandb_writer import WandbWriter
  w = WandbWriter('proj', directory=str(tmp_path / 'run'), config={'seed': 0})
  (run,) = fake_wandb.runs
  assert run.init_kwargs['mode'] == 'offline' and run.init_kwargs['project'] == 'proj'
  assert (tmp_path / 'run').is_dir()
  w.write_scalars(10, {'train/loss': 1.5})
  writers.write_run_info(w, {'learning_rate': 0.1, 'mesh': None}, '{}')
  w.close()
  assert run.logged == [(10, {'train/loss': 1.5})]
  assert run.config.values == {'seed': 0, 'learning_rate': 0.1}
  assert run.finished


def test_default_writer_adds_wandb_only_when_asked(fake_wandb, tmp_path, monkeypatch):
  monkeypatch.setenv('WANDB_MODE', 'disabled')
  w = writers.create_default_writer(str(tmp_path), console=False)
  w.close()
  assert fake_wandb.runs == []
  w = writers.create_default_writer(str(tmp_path / 'r'), console=False, wandb_project='p')
  w.write_scalars(1, {'x': 2.0})
  w.close()
  (run,) = fake_wandb.runs
  assert run.init_kwargs['mode'] == 'disabled' and run.init_kwargs['name'] == 'r'
  assert run.logged == [(1, {'x': 2.0})] and run.finished


def test_missing_wandb_is_a_config_error_naming_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, 'wandb', None)      # import wandb raises ImportError
  from purax.io.wandb_writer import WandbWriter
  with pytest.raises(ConfigError, match=r"wandb: expected the wandb package \(pip install 'purax\[wandb\]'\)"):
    WandbWriter('p')


@pytest.mark.slow
def test_real_wandb_offline_run_writes_its_files(tmp_path, monkeypatch):
  pytest.importorskip('wandb')
  monkeypatch.delenv('WANDB_MODE', raising=False)
  monkeypatch.setenv('WANDB_SILENT', 'true')
  from purax.io.wandb_writer import WandbWriter
  w = WandbWriter('purax-test', directory=str(tmp_path), config={'seed': 0})
  w.write_scalars(1, {'train/loss': 2.0})
  w.write_scalars(2, {'train/loss': 1.0})
  w.close()
  (run_dir,) = glob.glob(str(tmp_path / 'wandb' / 'offline-run-*'))
  assert glob.glob(os.path.join(run_dir, 'run-*.wandb'))
