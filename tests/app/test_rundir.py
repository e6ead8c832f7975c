"""The run directory: a failure keeps what a committed checkpoint holds, and
removes what a new run wrote before one; its files are purax's own, never
written or read through a link out of it."""

import os
import shutil

import jax
import pytest

import purax
from purax.app import job as job_lib
from purax.app import runs
from purax.app.config import TrainConfig
from purax.app.rundir import WorkdirLock
from purax.core.errors import ConfigError
from tests.helpers_runs import purax as purax_cli

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


@pytest.mark.slow
def test_a_symlinked_lock_is_refused_and_its_target_left_unchanged(tmp_path):
  """Issue 28.1: `ln -s ../scratch/victim WORKDIR/.purax.lock`, then `purax train`."""
  victim = tmp_path / 'scratch' / 'victim'
  victim.parent.mkdir()
  victim.write_text('precious')
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / '.purax.lock').symlink_to('../scratch/victim')
  refused = r"\.purax\.lock: expected a regular file .*got a symlink to '\.\./scratch/victim'"
  with pytest.raises(ConfigError, match=refused):
    WorkdirLock(str(workdir))
  done = purax_cli('train', '--workdir', str(workdir), '--model', 'mlp', '--steps', '2',
                   '--no-progress')
  assert done.returncode != 0 and '.purax.lock: expected a regular file' in done.stderr
  assert victim.read_text() == 'precious'
  assert os.listdir(workdir) == ['.purax.lock']      # nothing written beside it


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('finished') / 'run'
  runs.train(TrainConfig.of(**CONFIG, workdir=str(workdir)))
  return workdir


def test_a_linked_config_is_refused_on_resume(tmp_path, finished_run):
  """Issue 28.1: config.json linked to another file, even one in the run
  directory, is not the run's config: resuming names it and reads nothing."""
  workdir = tmp_path / 'run'
  shutil.copytree(finished_run, workdir)
  os.rename(workdir / 'config.json', workdir / 'other.json')
  (workdir / 'config.json').symlink_to('other.json')
  with pytest.raises(ConfigError, match=r"config\.json: expected a regular file .*got a symlink "
                                        r"to 'other\.json'"):
    runs.train(TrainConfig.of(**dict(CONFIG, steps=6), workdir=str(workdir)))


def test_a_link_out_of_the_run_directory_is_refused_before_a_write_or_a_restore(
    tmp_path, finished_run):
  """Issue 28.1: checkpoints/ linked to another directory: neither resuming
  (orbax would write there) nor evaluating (it would restore that) uses it."""
  workdir = tmp_path / 'run'
  shutil.copytree(finished_run, workdir)
  elsewhere = tmp_path / 'elsewhere'
  os.rename(workdir / 'checkpoints', elsewhere)
  (workdir / 'checkpoints').symlink_to(elsewhere)
  refused = (r'run/checkpoints: expected a file or directory inside the run directory .*, got '
             r'a symlink to .*elsewhere.*, outside it')
  with pytest.raises(ConfigError, match=refused):
    runs.train(TrainConfig.of(**dict(CONFIG, steps=6), workdir=str(workdir)))
  with pytest.raises(ConfigError, match=refused):
    runs.evaluate_run(str(workdir))
  assert sorted(os.listdir(elsewhere)) == ['2', '4']
