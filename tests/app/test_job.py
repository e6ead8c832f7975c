"""purax.app.job: what a run builds from its config before writing (the task,
its guards and loss, from the command line's options)."""

import pytest

import purax
from purax.app.config import TrainConfig
from purax.app.job import build_task
from purax.core import objectives
from purax.core.errors import ConfigError


def test_the_cli_options_make_the_guard_and_the_z_loss():
  config = TrainConfig.of(model='mlp', spike_k=6.0, spike_window=16).validate()
  task = build_task(config, num_classes=10, input_shape=(8, 8, 1))
  assert task.spike_guard == purax.SpikeGuard(window=16, k=6.0)
  assert build_task(TrainConfig.of(model='mlp'), num_classes=10,
                    input_shape=(8, 8, 1)).spike_guard is None
  lm = TrainConfig.of(model='lm', dataset='pystdlib', z_loss=1e-4, d_model=8, num_layers=1,
                      num_heads=2, seq_len=8).validate()
  assert build_task(lm, num_classes=256, input_shape=(8,)).loss == \
      objectives.language_model_loss(z_loss=1e-4)
  with pytest.raises(ConfigError, match='z_loss: expected 0 unless the data is text'):
    TrainConfig.of(model='mlp', z_loss=1e-4).validate()
  with pytest.raises(ConfigError, match=r'spike_window: expected an integer in \[2, 2\*\*24'):
    TrainConfig.of(spike_k=6.0, spike_window=1).validate()


def test_a_spike_rollback_ring_that_cannot_fit_in_host_memory_is_refused_before_it_is_made():
  import dataclasses
  from purax.app import job as job_lib
  config = TrainConfig.of(model='mlp', steps=10 ** 6, spike_k=6.0, spike_rollback=10 ** 6,
                          log_every=1).validate()
  with pytest.raises(ConfigError, match=r'^spike_rollback: expected a ring of 1000000 snapshots '
                                        r'of the state \(one every 1 steps\) that fits in the '):
    job_lib.build(config)
  job = job_lib.build(dataclasses.replace(config, optimizer=dataclasses.replace(
      config.optimizer, spike_rollback=100)))                    # 100 snapshots fit
  assert any(type(h).__name__ == 'SpikeRollback' for h in job.hooks)
