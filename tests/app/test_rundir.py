"""The run directory: a failure keeps what a committed checkpoint holds, and
removes what a new run wrote before one."""

import os

import jax
import pytest

import purax
from purax.app import job as job_lib
from purax.app import runs
from purax.app.config import TrainConfig

CONFIG = dict(model='mlp', steps=4, batch_size=16, log_every=2, eval_every=0,
              checkpoint_every=2, progress=False)


def test_a_failure_after_a_committed_checkpoint_keeps_the_directory(tmp_path, monkeypatch):
  real_fit = runs._fit   # pylint: disable=protected-access

  def fit_then_fail(*args, **kwargs):
    real_fit(*args, **kwargs)
    raise RuntimeError('disk full after training')

  monkeypatch.setattr(runs, '_fit', fit_then_fail)
  workdir = tmp_path / 'run'
  with pytest.raises(RuntimeError, match='disk full'):
    runs.train(TrainConfig.of(**CONFIG, workdir=str(workdir)))
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['2', '4']
  assert (workdir / 'config.json').is_file()


def test_a_failure_before_any_checkpoint_removes_the_new_directory(tmp_path, monkeypatch):
  def fail(*args, **kwargs):
    raise RuntimeError('no space')

  monkeypatch.setattr(runs, '_fit', fail)
  workdir = tmp_path / 'run'
  with pytest.raises(RuntimeError, match='no space'):
    runs.train(TrainConfig.of(**CONFIG, workdir=str(workdir)))
  assert not workdir.exists()


def test_restore_or_init_takes_a_run_directory(tmp_path):
  workdir = tmp_path / 'run'
  runs.train(TrainConfig.of(**CONFIG, workdir=str(workdir)))
  job = job_lib.build(TrainConfig.of(**CONFIG, workdir=str(workdir)).validate(), mesh=False)
  restored = purax.restore_or_init(str(workdir), job.task, jax.random.key(0), job.sample)
  assert restored.step == 4
