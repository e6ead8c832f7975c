"""The verdict of a run, a sweep or a range test on a time budget
(``verdict.json``, :mod:`purax.app.verdict`): what it holds, what purax did on
its own, Welch's test of a sweep's seeds, the tokens or examples seen. The
hook's plan: tests/hooks/test_time_budget.py."""

import json
import math
import os

import jax
import numpy as np
import pytest
from scipy import stats

from purax.app import runs
from purax.app import verdict as verdict_lib
from purax.app.config import TrainConfig
from purax.core.errors import ConfigError
from purax.hooks.time_budget import REASON, TimeBudget
from tests.helpers_budget import BATCHES, TASK


# -- a run's verdict ------------------------------------------------------------------

CONFIG = dict(model='mlp', steps=12, batch_size=8, log_every=4, eval_every=0,
              progress=False, checkpoint_interval_s=0.0)


def test_a_run_on_a_budget_writes_one_verdict(tmp_path):
  workdir = tmp_path / 'r'
  final = runs.train(TrainConfig.of(**CONFIG, time_budget='1h', workdir=str(workdir)))
  verdict = verdict_lib.read(str(workdir))
  assert set(verdict) == {'format', 'status', 'end', 'step', 'metric', 'seen', 'config',
                          'budget_s', 'wall_s', 'compile_s', 'time_budget', 'schedule',
                          'memory_fits', 'nan_diagnoses'}
  assert verdict['status'] == 'finished' and verdict['step'] == 12   # --steps came first
  assert verdict['end']['reason'] == 'reached step 12'
  assert verdict['metric'] == {f'eval/{k}': v for k, v in final.items()}
  assert verdict['seen'] == {'examples': 12 * 8}
  assert verdict['schedule'] == {'decay_steps': 12, 'ended_at_its_end': True,
                                 'planned_before_start': None}     # no --plan-decay
  assert TrainConfig.from_json(json.dumps(verdict['config'])).run.time_budget == '1h'
  assert verdict['budget_s'] == 3600.0 and 0 < verdict['wall_s'] < 3600
  assert verdict['compile_s'] > 0 and verdict['time_budget']['compile_s'] >= 0
  assert verdict['time_budget']['planned_step'] > 12       # planned, then --steps ended it
  assert verdict['memory_fits'] == [] and verdict['nan_diagnoses'] == []
  # Without a budget there is no verdict.
  runs.train(TrainConfig.of(**CONFIG, workdir=str(tmp_path / 'plain')))
  assert not os.path.exists(tmp_path / 'plain' / verdict_lib.VERDICT)


def test_a_budget_spent_by_start_up_writes_nothing(tmp_path, monkeypatch):
  from purax.app import job as job_lib
  import time
  monkeypatch.setattr(job_lib, 'process_started', lambda: time.monotonic() - 3600)
  workdir = tmp_path / 'r'
  with pytest.raises(ConfigError, match=r'time_budget: expected more than the 36\d\d\.\d s'):
    runs.train(TrainConfig.of(**CONFIG, time_budget='1h', workdir=str(workdir)))
  assert not workdir.exists()         # nothing written but the error


def test_the_verdict_lists_what_purax_did_on_its_own(tmp_path):
  class End:
    status, step = 'finished', 4

    def as_dict(self):
      return {'status': 'finished', 'step': 4}

  config = TrainConfig.of(model='mlp', fit_memory=True, memory_budget='1GiB', batch_size=8)
  budget = TimeBudget(60.0)
  v = verdict_lib.of_run(config, End(), {'loss': 0.5}, budget, fitted_now=True,
                         replay_dir=str(tmp_path / 'none'), compile_s=1.0)
  assert v['memory_fits'] == [{'action': 'memory_fit', 'when': 'this invocation',
                               'remat': 'none', 'microbatches': 1, 'precision': 'auto',
                               'mesh': None, 'memory_budget': '1GiB'}]
  from purax.core.nonfinite import Report
  from purax.io.checkpoint import replay
  state = TASK.init(jax.random.key(0), BATCHES[0])
  found = Report(step=3, where='batch', path="batch['x']", detail='holds 1 NaN')
  replay.save_update(str(tmp_path / 'nonfinite'), state, BATCHES[0], found.as_dict())
  v = verdict_lib.of_run(config, End(), {}, budget, fitted_now=False,
                         replay_dir=str(tmp_path / 'nonfinite'), compile_s=1.0)
  assert [(d['action'], d['saved_step'], d['step'], d['where'], d['path'])
          for d in v['nan_diagnoses']] == [('nan_diagnosis', 0, 3, 'batch', "batch['x']")]
  assert v['memory_fits'][0]['when'].startswith('when the run began')
  assert v['seen'] == {'examples': 4 * 8}


# -- a sweep's seeds ------------------------------------------------------------------


def test_welch_matches_its_definition():
  a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 9.0, 11.0]
  got = verdict_lib.welch(a, b)
  va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 5
  t = (np.mean(a) - np.mean(b)) / math.sqrt(va + vb)
  df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 4)
  assert got['t'] == pytest.approx(t) and got['df'] == pytest.approx(df)
  assert got['p'] == pytest.approx(2 * stats.t.sf(abs(t), df))
  assert verdict_lib.welch([1.0], b) == {'t': None, 'df': None, 'p': None}
  assert verdict_lib.welch([1.0, 1.0], [1.0, 1.0]) == {'t': None, 'df': None, 'p': None}


def test_members_are_grouped_by_configuration_against_a_baseline():
  rows = [{'member': i, 'seed': i % 3, 'learning_rate': lr, 'eval_loss': loss}
          for i, (lr, loss) in enumerate([(0.1, 1.0), (0.1, 1.2), (0.1, 1.1),
                                          (0.01, 2.0), (0.01, 2.4), (0.01, 2.2)])]
  groups = verdict_lib.by_configuration(rows, 'loss', ['learning_rate'], baseline=4)
  assert [g['members'] for g in groups] == [[0, 1, 2], [3, 4, 5]]
  assert [g['baseline'] for g in groups] == [False, True]     # member 4's configuration
  assert groups[0]['mean_loss'] == pytest.approx(1.1)
  assert groups[1]['std_loss'] == pytest.approx(0.2)
  assert groups[1]['welch_vs_baseline'] is None
  assert groups[0]['welch_vs_baseline'] == verdict_lib.welch([1.0, 1.2, 1.1], [2.0, 2.4, 2.2])
  assert groups[0]['welch_vs_baseline']['p'] < 0.01


def test_a_sweep_on_a_budget_reports_each_member_and_its_seeds(tmp_path):
  from purax.app import sweep
  from purax.app.sweep_config import SweepConfig
  workdir = tmp_path / 's'
  summary = sweep.run(SweepConfig.of(
      model='mlp', learning_rate='1e-3,1e-2', seeds='0,1,2', steps=6, batch_size=16,
      log_every=3, eval_every=0, progress=False, time_budget='1h', baseline=3,
      workdir=str(workdir)))
  verdict = verdict_lib.read(str(workdir))
  assert verdict['status'] == 'finished' and verdict['step'] == 6   # --steps came first
  assert verdict['metric_name'] == 'eval/loss' and verdict['baseline'] == 3
  assert verdict['budget_s'] == 3600.0 and verdict['config']['time_budget'] == '1h'
  members = verdict['members']
  assert [(m['member'], m['seed'], m['steps']) for m in members] == [
      (i, i % 3, 6) for i in range(6)]
  assert all(m['seen'] == {'examples': 6 * 16} for m in members)
  by_member = {r['member']: r for r in summary['members']}
  assert [m['metric']['eval/loss'] for m in members] == [
      by_member[i]['eval_loss'] for i in range(6)]
  assert [m['hparams']['learning_rate'] for m in members] == [1e-3] * 3 + [1e-2] * 3
  # The seeds are the population's axis: per configuration, mean, spread and
  # Welch's test against the configuration of member 3 (the baseline).
  groups = verdict['configurations']
  assert [(g['members'], g['baseline']) for g in groups] == [([0, 1, 2], False),
                                                            ([3, 4, 5], True)]
  losses = [by_member[i]['eval_loss'] for i in range(6)]
  assert groups[0]['mean_loss'] == pytest.approx(np.mean(losses[:3]))
  assert groups[0]['std_loss'] == pytest.approx(np.std(losses[:3], ddof=1))
  assert groups[0]['welch_vs_baseline'] == pytest.approx(
      verdict_lib.welch(losses[:3], losses[3:]))
  assert groups[1]['welch_vs_baseline'] is None
  assert verdict['memory_fits'] == [] and verdict['nan_diagnoses'] == []


def test_a_run_the_budget_ended_is_over_for_the_same_command(tmp_path, monkeypatch):
  import time
  from purax.app import job as job_lib
  # A budget of 100 s of which 88 s are gone when the job is built: the run
  # trains for the rest and ends by the budget, long before --steps.
  monkeypatch.setattr(job_lib, 'time_budget', lambda duration, eval_data, **k: TimeBudget(
      100.0, eval_data=eval_data, started=time.monotonic() - 88.0, tail_s=1.0))
  workdir = tmp_path / 'r'
  config = TrainConfig.of(**{**CONFIG, 'steps': 10 ** 6}, time_budget='100s',
                          workdir=str(workdir))
  final = runs.train(config)
  verdict = verdict_lib.read(str(workdir))
  step = verdict['step']
  assert verdict['status'] == 'finished' and verdict['end']['reason'].startswith(REASON)
  assert 4 < step < 10 ** 6 and verdict['seen'] == {'examples': step * 8}
  assert verdict['time_budget']['planned_step'] <= step      # the plan's (or a later) step
  assert verdict['metric'] == {f'eval/{k}': v for k, v in final.items()}
  # The same command trains nothing (the run is over), whatever its clock says.
  lines = (workdir / 'metrics.jsonl').read_text()
  assert runs.train(config) == final
  assert (workdir / 'metrics.jsonl').read_text() == lines
  assert verdict_lib.read(str(workdir)) == verdict


def test_a_nan_diagnosed_on_a_budget_is_in_the_verdict(tmp_path, capsys):
  from purax.app import cli
  rng = np.random.default_rng(0)
  x = rng.normal(size=(32, 6)).astype(np.float32)
  x[5, :] = 3e38          # finite, but the first layer's output overflows to inf
  np.savez(tmp_path / 'd.npz', x_train=x, y_train=rng.integers(0, 3, 32),
           x_test=rng.normal(size=(8, 6)).astype(np.float32), y_test=rng.integers(0, 3, 8))
  workdir = tmp_path / 'run'
  assert cli.main(['train', '--dataset', f'npz:{tmp_path / "d.npz"}', '--model', 'mlp',
                   '--steps', '4', '--batch-size', '8', '--log-every', '2', '--eval-every', '0',
                   '--no-progress', '--debug-nans', '--time-budget', '1h',
                   '--workdir', str(workdir)]) == 0
  verdict = verdict_lib.read(str(workdir))
  assert [(d['action'], d['saved_step'], d['step'], d['where'], d['path'])
          for d in verdict['nan_diagnoses']] == [('nan_diagnosis', 2, 2, 'forward', 'Dense_0')]
  assert verdict['memory_fits'] == [] and verdict['status'] == 'finished'


@pytest.mark.slow
def test_a_stopped_run_has_a_verdict_and_its_resume_plans_in_its_own_budget(tmp_path):
  from tests.helpers_runs import ARGS, purax as run_purax
  workdir = str(tmp_path / 'r')
  first = run_purax('train', *ARGS, '--time-budget', '1h', '--workdir', workdir,
                    recorded_stop=20)
  assert first.returncode == 0, first.stderr[-3000:]     # a stop request at step 20
  stopped = verdict_lib.read(workdir)
  assert (stopped['status'], stopped['step']) == ('stopped', 20)
  assert stopped['metric'] == {} and stopped['seen'] == {'examples': 20 * 32}
  again = run_purax('train', *ARGS, '--time-budget', '1h', '--workdir', workdir)
  assert again.returncode == 0, again.stderr[-3000:]
  verdict = verdict_lib.read(workdir)
  assert (verdict['status'], verdict['step']) == ('finished', 40)
  # This invocation's plan: from the step it resumed at (20), after its own
  # compiling call and 3 probe steps, in its own hour.
  assert verdict['time_budget']['plans'][0]['step'] == 24
  assert 0 < verdict['wall_s'] < 3600 and verdict['budget_s'] == 3600.0


def test_a_language_model_counts_tokens_seen():
  config = TrainConfig.of(model='lm', dataset='pystdlib', batch_size=4, seq_len=16)
  assert verdict_lib.seen(config, 10) == {'tokens': 10 * 4 * 16}
  assert verdict_lib.seen(TrainConfig.of(model='cnn', batch_size=4), 10) == {'examples': 40}
