"""A run on a time budget plans its steps before it starts, and its
learning-rate schedule decays over them (:mod:`purax.app.calibrate`): the
same steps as a plain run of that many, bitwise; a resumed run keeps the
schedule (a fresh process)."""

import time

import jax
import numpy as np
import pytest

from purax.app import calibrate, job as job_lib, runs, verdict as verdict_lib
from purax.app.config import TrainConfig
from purax.app.rundir import read_config
from purax.core.errors import ConfigError
from tests.helpers_runs import final_tree, purax

CONFIG = dict(model='mlp', steps=10 ** 6, batch_size=8, log_every=50, eval_every=0,
              progress=False, checkpoint_interval_s=0.0, warmup_steps=10, plan_decay=True,
              steps_per_call=1)


def test_a_budget_run_decays_over_its_planned_steps_as_a_plain_run_of_them(tmp_path, monkeypatch):
  started = time.monotonic()
  monkeypatch.setattr(job_lib, 'process_started', lambda: started)   # the budget's clock
  monkeypatch.setattr(calibrate, 'PAYS', 1e9)     # a second compilation always pays here
  budget = tmp_path / 'budget'
  runs.train(TrainConfig.of(**CONFIG, time_budget='12s', workdir=str(budget)))
  decay = read_config(str(budget)).run.decay_steps        # recorded for a resume
  verdict = verdict_lib.read(str(budget))
  end = verdict['step']
  assert verdict['status'] == 'finished' and 0 < end <= decay < 10 ** 6
  planned = verdict['schedule']['planned_before_start']
  assert planned['decay_steps'] == planned['planned_steps'] == decay
  assert verdict['schedule']['decay_steps'] == decay
  assert verdict['schedule']['ended_at_its_end'] == (end == decay)
  if end == decay:
    assert "steps (its last step)" in verdict['end']['reason']
  # The budget's steps are those of `purax train --steps END --decay-steps DECAY`.
  plain = tmp_path / 'plain'
  runs.train(TrainConfig.of(**{**CONFIG, 'steps': end, 'plan_decay': False}, decay_steps=decay,
                            workdir=str(plain)))
  ours, _, step = final_tree(str(budget))
  theirs, _, plain_step = final_tree(str(plain))
  assert step == plain_step == end
  jax.tree.map(np.testing.assert_array_equal, ours['state'], theirs['state'])


def test_a_resumed_budget_run_keeps_its_schedule_in_a_fresh_process(tmp_path, monkeypatch,
                                                                   capsys):
  started = time.monotonic()
  monkeypatch.setattr(job_lib, 'process_started', lambda: started)
  monkeypatch.setattr(calibrate, 'PAYS', 1e9)
  workdir = tmp_path / 'r'
  args = ['train', '--model', 'mlp', '--steps', '1000000', '--batch-size', '8',
          '--log-every', '50', '--eval-every', '0', '--no-progress', '--plan-decay',
          '--workdir', str(workdir)]
  runs.train(TrainConfig.of(**CONFIG, time_budget='12s', workdir=str(workdir)))
  assert 'steps fit in the budget' in capsys.readouterr().err
  decay = read_config(str(workdir)).run.decay_steps
  end = verdict_lib.read(str(workdir))['step']
  assert end <= decay < 10 ** 6
  # Another budget: the same schedule, planned when the run began; at its end, nothing to train.
  again = purax(*args, '--time-budget', '12s')
  assert again.returncode == 0, again.stderr[-2000:]
  assert 'steps fit in the budget' not in again.stderr           # not planned again
  assert read_config(str(workdir)).run.decay_steps == decay
  resumed = verdict_lib.read(str(workdir))['step']
  if end == decay:
    assert (f'has already ended: nothing to train (to train on, pass --steps S --decay-steps S '
            f'with S above {decay}, where its learning-rate schedule ended') in again.stderr
    assert resumed == end
  else:
    assert end <= resumed <= decay


def test_a_run_killed_before_its_first_checkpoint_plans_its_steps_when_rerun(tmp_path,
                                                                            monkeypatch):
  started = time.monotonic()
  monkeypatch.setattr(job_lib, 'process_started', lambda: started)
  monkeypatch.setattr(calibrate, 'PAYS', 1e9)
  workdir = tmp_path / 'r'
  config = TrainConfig.of(**CONFIG, time_budget='12s', workdir=str(workdir))
  workdir.mkdir()     # what a SIGKILL while planning leaves: config.json, no checkpoint
  (workdir / 'config.json').write_text(config.validate().resolved().to_json())
  runs.train(config)
  verdict = verdict_lib.read(str(workdir))
  assert verdict['schedule']['planned_before_start']['planned_steps'] is not None
  assert read_config(str(workdir)).run.decay_steps == verdict['schedule']['decay_steps']


def test_a_plan_whose_second_compilation_would_not_pay_changes_nothing(tmp_path, monkeypatch):
  """Compiling again for the planned schedule would cost more than
  calibrate.PAYS of the planned steps (here: any cost): the calibration ends
  at its first plan (the compiling call and the 3 probe steps), the schedule
  spans --steps, and the run trains with the programs already compiled."""
  started = time.monotonic()
  monkeypatch.setattr(job_lib, 'process_started', lambda: started)
  monkeypatch.setattr(calibrate, 'PAYS', 0.0)
  workdir = tmp_path / 'r'
  runs.train(TrainConfig.of(**CONFIG, time_budget='6s', workdir=str(workdir)))
  verdict = verdict_lib.read(str(workdir))
  planned = verdict['schedule']['planned_before_start']
  assert planned['not_planned'].startswith('compiling again (')
  assert planned['planned_steps'] is None and planned['calibration_steps'] == 4
  assert read_config(str(workdir)).run.decay_steps is None
  assert verdict['schedule']['decay_steps'] == 10 ** 6
  assert verdict['time_budget']['compile_s'] == 0.0     # its step: the calibration's program


def test_without_plan_decay_a_budget_run_plans_nothing_and_decays_over_steps(tmp_path,
                                                                            monkeypatch):
  started = time.monotonic()
  monkeypatch.setattr(job_lib, 'process_started', lambda: started)
  workdir = tmp_path / 'r'
  runs.train(TrainConfig.of(**{**CONFIG, 'plan_decay': False}, time_budget='5s',
                            workdir=str(workdir)))
  verdict = verdict_lib.read(str(workdir))
  assert verdict['schedule'] == {'decay_steps': 10 ** 6, 'ended_at_its_end': False,
                                 'planned_before_start': None}
  assert read_config(str(workdir)).run.decay_steps is None
  with pytest.raises(ConfigError, match=r'^plan_decay: expected set only with --time-budget'):
    TrainConfig.of(**CONFIG).validate()


def test_a_budget_run_at_its_decay_steps_trains_nothing_under_a_new_budget(tmp_path, capsys):
  workdir = tmp_path / 'r'
  config = dict(CONFIG, plan_decay=False, steps=1000, decay_steps=30, workdir=str(workdir))
  runs.train(TrainConfig.of(**config, time_budget='1h'))
  verdict = verdict_lib.read(str(workdir))
  assert verdict['step'] == 30 and verdict['schedule']['ended_at_its_end']
  assert verdict['end']['reason'].startswith('time budget of 3600 s: 30 steps (its last step)')
  capsys.readouterr()
  runs.train(TrainConfig.of(**config, time_budget='2h'))     # another budget: still at its end
  assert ('has already ended: nothing to train (to train on, pass --steps S --decay-steps S '
          'with S above 30, where its learning-rate schedule ended') in capsys.readouterr().err
  assert verdict_lib.read(str(workdir))['step'] == 30
