"""The options of ``purax tune lr`` (purax.app.tune_config.RangeConfig): a bad
grid is refused by name before any work, on the command line and by the
config's ``validate()``. The range test itself: tests/app/test_tune.py."""

import os

import pytest

from purax import tune
from purax.app import cli


def test_tune_lr_refuses_bad_grids_before_any_work(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)             # the default workdir would be made here
  assert cli.main(['tune', 'lr', '--min-lr', '1e-2', '--max-lr', '1e-3']) == 2
  assert 'min_lr, max_lr: expected 0 < min_lr < max_lr' in capsys.readouterr().err
  assert cli.main(['tune', 'lr', '--max-lr', '20']) == 2
  assert 'max_lr: expected <= 10' in capsys.readouterr().err
  assert cli.main(['tune', 'lr', '--steps', '2']) == 2     # too few to tell the rates apart
  assert ('steps: expected at least 8 steps for a range test to tell the rates apart (raise '
          '--steps), got 2') in capsys.readouterr().err
  with pytest.raises(tune.RangeTestError, match='steps: expected at least 8'):  # by the config
    cli.parse(['tune', 'lr', '--steps', '7']).what.validate()
  assert os.listdir(tmp_path) == []


def test_tune_lr_refuses_a_spike_rollback_it_would_ignore(tmp_path, capsys, monkeypatch):
  """A range test is a population: it trained on and ignored --spike-rollback."""
  monkeypatch.chdir(tmp_path)             # the default workdir would be made here
  assert cli.main(['tune', 'lr', '--spike-k', '6', '--spike-rollback', '10', '--steps', '20']) == 2
  assert ('spike_rollback: expected 0 for a population (a rollback restores one run\'s state: '
          'purax train --spike-rollback), got 10') in capsys.readouterr().err
  assert os.listdir(tmp_path) == []
