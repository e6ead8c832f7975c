"""The options of ``purax sweep`` (purax.app.sweep_config.SweepConfig), checked
by ``validate()`` before anything runs: PBT on the evaluation cadence, the
population's size and each member's spike window against their bounds and the
memory. The sweep itself: tests/app/test_sweep.py."""

import os

import pytest

import purax
from purax.app import cli
from purax.app.sweep_config import SweepConfig
from purax.core.errors import ConfigError


def test_pbt_off_the_evaluation_cadence_is_a_clear_error():
  with pytest.raises(ConfigError, match=r'pbt_every: expected 0 or a multiple of eval_every=100'):
    SweepConfig.of(learning_rate='1e-3,2e-3', pbt_every=50, eval_every=100).validate()
  with pytest.raises(ConfigError, match=r'pbt_every: expected a multiple of eval_every=2'):
    purax.hooks.PBT(every=3).check(2)


@pytest.mark.parametrize('args, match', [
    (['--members', str(10 ** 9), '--lr', 'loguniform:1e-4:1e-2'],
     r'^members: expected a population of 1 to 2\*\*16 = 65536 members, got 1000000000 '
     r'\(--members\)$'),
    (['--lr', ','.join(str(v) for v in range(1, 11)), '--seeds', ','.join(map(str, range(10 ** 4)))],
     r'^members: expected a population of 1 to 2\*\*16 = 65536 members, got 100000 \(the grid: '
     r'10 x 10000 seeds\)$'),
    (['--members', '65536', '--lr', 'loguniform:1e-4:1e-2', '--spike-k', '6', '--spike-window',
      str(2 ** 24)],
     r'^spike_window: expected a window whose state \(65536 members\) fits in the [\d.]+ [MG]iB '
     r'available .*, got 16777216, needing 8192.00 GiB \(float32 \[window, 2\] .* per member\)$'),
])
def test_a_population_beyond_its_bound_or_the_memory_is_refused_by_the_config(args, match):
  """The population's size (--members, or the grid counted without building
  it) and each member's spike window are checked by SweepConfig.validate()
  before any array of that size exists: the check makes no array at all."""
  import jax
  config = cli.parse(['sweep', *args])
  before = {id(a) for a in jax.live_arrays()}
  with pytest.raises(ConfigError, match=match):
    config.validate()
  assert {id(a) for a in jax.live_arrays()} <= before     # counted, never allocated


def test_a_sweep_refuses_a_spike_rollback_it_would_ignore(tmp_path, capsys, monkeypatch):
  """A rollback restores one run's state from its ring (purax train): a sweep
  trained on and ignored --spike-rollback, exit status 0."""
  monkeypatch.chdir(tmp_path)             # the default workdir would be made here
  assert cli.main(['sweep', '--lr', '1e-3,2e-3', '--spike-k', '6', '--spike-rollback', '10',
                   '--steps', '20']) == 2
  assert ('spike_rollback: expected 0 for a population (a rollback restores one run\'s state: '
          'purax train --spike-rollback), got 10') in capsys.readouterr().err
  assert os.listdir(tmp_path) == []
