"""``--time-budget``: the steps planned from the measured step time
(:class:`purax.hooks.TimeBudget`, on a fake clock: counts, never wall times),
the verdict of a run (``verdict.json``), Welch's test of a sweep's seeds, and
the named errors of a bad or too short budget."""

import json
import math
import os

import jax
import numpy as np
import optax
import pytest
from scipy import stats

import purax
from purax import hooks as hooks_lib
from purax.app import runs
from purax.app import verdict as verdict_lib
from purax.app.config import TrainConfig
from purax.core.errors import ConfigError
from purax.hooks.time_budget import REASON, TimeBudget, ended_by_budget, parse_duration
from purax.io.checkpoint.run import Restored


# -- the duration ---------------------------------------------------------------------


@pytest.mark.parametrize('text, seconds', [('60s', 60.0), ('5m', 300.0), ('1h', 3600.0),
                                           ('1.5h', 5400.0), (' 90 s ', 90.0), ('.5s', 0.5)])
def test_a_duration_is_a_number_and_a_unit(text, seconds):
  assert parse_duration(text) == seconds


@pytest.mark.parametrize('text', ['60', '5d', '-5s', '0s', 'soon', '', '1e3s', 's'])
def test_a_bad_duration_is_a_named_error(text):
  with pytest.raises(ConfigError, match=r"time_budget: expected a duration"):
    parse_duration(text)


def test_the_config_checks_the_budget_before_anything_runs():
  with pytest.raises(ConfigError, match=r"time_budget: expected a duration such as '60s'.*"
                                        r"got '60'"):
    TrainConfig.of(model='mlp', time_budget='60').validate()
  with pytest.raises(ConfigError, match='time_budget: expected unset for a multi-host run'):
    TrainConfig.of(model='mlp', time_budget='60s', num_processes=2, process_id=0,
                   coordinator='localhost:1', workdir='x').validate()
  TrainConfig.of(model='mlp', time_budget='5m').validate()


# -- the plan, on a fake clock ---------------------------------------------------------

TASK = purax.Task(model=purax.nn.MLP(features=(8,), num_classes=3),
                  tx=optax.sgd(0.1))
RNG = np.random.default_rng(0)
BATCHES = [{'x': RNG.normal(size=(4, 5)).astype(np.float32),
            'y': RNG.integers(0, 3, size=(4,)).astype(np.int32)} for _ in range(8)]
EVAL = BATCHES[:2]


class Data:
  """Random access by step: batch ``s % 8``, for ``n`` steps."""

  def __init__(self, n):
    self.n = n

  def __len__(self):
    return self.n

  def __getitem__(self, s):
    return BATCHES[s % len(BATCHES)]


class FakeTime:
  """A clock, and a hook (before the budget's) that sets it from the step:
  ``now = start + compile_s + the step times of the steps run`` after the
  first call (which compiled ``compile_s``); ``start`` before it. Binary
  fractions: every sum is exact."""

  order, every, name = -30, None, 'fake_time'

  def __init__(self, start=96.0, compile_s=2.0, step_s=lambda step: 2 ** -6):
    self.start, self.compile_s, self.step_s = start, compile_s, step_s
    self.now, self.first, self.done = start, None, 0.0

  def at(self, step):
    return self.start + self.compile_s + sum(self.step_s(s) for s in range(self.first, step))

  def __call__(self, info):
    if self.first is None:
      self.first = info.step
    if info.step > self.first and info.end is None:
      self.now, self.done = self.at(info.step), self.compile_s
    return None

  def clock(self):
    return self.now

  def compiled(self):
    return self.done


def run(budget_s, fake, *, state=None, steps=100_000, log_every=50, tail_s=1.0):
  budget = TimeBudget(budget_s, started=fake.start, eval_data=EVAL, tail_s=tail_s,
                      clock=fake.clock, compiled=fake.compiled)
  state = TASK.init(jax.random.key(0), BATCHES[0]) if state is None else state
  state, history = purax.fit(TASK, state, Data(steps), hooks=hooks_lib.standard(
      log_every=log_every, eval_data=EVAL, progress=False) + [fake, budget],
                             steps_per_call=1)
  return state, history, budget


def planned(step, now, step_s, *, deadline=112.0, reserve=1.0):
  """The rule: the steps that fit in what is left once the reserve is kept."""
  return step + max(math.floor((deadline - now - reserve) / step_s), 0)


@pytest.mark.parametrize('step_s, expected', [(2 ** -6, 832), (2 ** -5, 416)])
def test_the_steps_follow_the_measured_step_time(step_s, expected):
  fake = FakeTime(step_s=lambda s: step_s)
  state, history, budget = run(16.0, fake)
  # The first call compiled (2 s, left out), 3 probe steps timed: planned at
  # step 4 from the clock then: 4 + floor((112 - 98.0625 - 1) / step_s).
  assert budget.compile_s == 2.0 and budget.step_s == step_s
  assert budget.plans[0] == (4, step_s, expected) == (4, step_s, planned(4, fake.at(4), step_s))
  assert len(budget.plans) == 1 + (expected - 1) // 50        # re-planned at each log point
  assert {p for _, _, p in budget.plans} == {expected}        # a true estimate stays
  assert int(state.step) == expected == history.end.step
  assert history.end.status == 'finished' and ended_by_budget(history.end)
  assert history.end.reason.startswith(f'{REASON} of 16 s: {expected} steps')
  assert 'eval/loss' in history[-1] and history[-1]['step'] == expected   # the final evaluation
  assert budget.eval_s == 0.0                                 # the fake clock: no eval time
  report = budget.report()
  assert report['planned_step'] == expected and report['replans'] == len(budget.plans) - 1


def test_a_wrong_estimate_is_corrected_at_a_log_point():
  # The step slows from 1/64 to 1/16 s at step 100: planned for the first, the
  # run is re-planned at each log point from the clock and the slower of the
  # mean step time since the plan and that of the last window.
  slow = lambda s: 2 ** -6 if s < 100 else 2 ** -4    # noqa: E731
  fake = FakeTime(step_s=slow)
  state, history, budget = run(16.0, fake)
  assert budget.plans[0] == (4, 2 ** -6, 832)
  previous = 4
  for step, step_s, plan in budget.plans[1:]:
    now = fake.at(step)
    assert step_s == max((now - fake.at(4)) / (step - 4),
                         (now - fake.at(previous)) / (step - previous))
    assert plan == planned(step, now, step_s)
    previous = step
  assert budget.plans[3][1] == 2 ** -4             # from step 150: the new step time
  end = int(state.step)
  assert ended_by_budget(history.end) and end == budget.plans[-1][2]
  # Planned for 832 until the first window of slow steps (at step 150): 283.
  assert [p for _, _, p in budget.plans] == [832, 832, 832, 283, 283, 283] and end == 283
  assert fake.at(end) + 1.0 <= 112.0                          # inside the budget, reserve kept


def test_a_resumed_run_plans_in_its_own_budget():
  # Budget per invocation: a run resumed at step 300 plans from its own clock,
  # so it ends inside its own budget whatever the first invocation used.
  state, history, _ = run(16.0, FakeTime(), steps=300)     # --steps ended it first
  assert int(state.step) == 300 and not ended_by_budget(history.end)
  fake = FakeTime(start=496.0)
  state, history, budget = run(16.0, fake, state=Restored(state, None, 300, None, {}))
  assert budget.plans[0] == (304, 2 ** -6, planned(304, fake.at(304), 2 ** -6, deadline=512.0))
  assert int(state.step) == budget.plans[0][2] == 304 + 828 and ended_by_budget(history.end)


def test_a_budget_too_short_for_one_step_is_a_named_error_before_the_second():
  fake = FakeTime(compile_s=15.0)          # start-up 0 s, compilation 15 s of 16
  with pytest.raises(ConfigError, match=r'time_budget: expected at least 16\.0 s \(start-up '
                                        r'and the compilation 15\.0 s, one step, and 1\.0 s'):
    run(16.0, fake)
  spent = FakeTime(start=100.0)            # start-up spent the budget before any call
  budget = TimeBudget(1.0, started=90.0, tail_s=0.5, clock=spent.clock)
  with pytest.raises(ConfigError, match=r'time_budget: expected more than the 10\.0 s the '
                                        r'start-up took'):
    purax.fit(TASK, TASK.init(jax.random.key(0), BATCHES[0]), Data(10), hooks=[budget])


# -- a run's verdict ------------------------------------------------------------------

CONFIG = dict(model='mlp', steps=12, batch_size=8, log_every=4, eval_every=0,
              progress=False, checkpoint_interval_s=0.0)


def test_a_run_on_a_budget_writes_one_verdict(tmp_path):
  workdir = tmp_path / 'r'
  final = runs.train(TrainConfig.of(**CONFIG, time_budget='1h', workdir=str(workdir)))
  verdict = verdict_lib.read(str(workdir))
  assert set(verdict) == {'format', 'status', 'end', 'step', 'metric', 'seen', 'config',
                          'budget_s', 'wall_s', 'compile_s', 'time_budget', 'memory_fits',
                          'nan_diagnoses'}
  assert verdict['status'] == 'finished' and verdict['step'] == 12   # --steps came first
  assert verdict['end']['reason'] == 'reached step 12'
  assert verdict['metric'] == {f'eval/{k}': v for k, v in final.items()}
  assert verdict['seen'] == {'examples': 12 * 8}
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


# -- the rule, shared with `purax tune lr --time-budget` ----------------------------------


def test_the_planning_rule_is_one_function_the_hook_uses():
  from purax.hooks.time_budget import plan_steps
  # (112 - 98.0625 - 1) / (1/64) = 828 steps after step 4; never below the step.
  assert plan_steps(4, 98.0625, 112.0, 2 ** -6, 1.0) == 832 == planned(4, 98.0625, 2 ** -6)
  assert plan_steps(10, 111.5, 112.0, 1.0, 1.0) == 10
  budget = TimeBudget(16.0, started=96.0, tail_s=1.0, clock=lambda: 0.0)
  budget.step_s = 2 ** -6
  assert budget.plan(4, 98.0625) == 832 and budget.plans == [(4, 2 ** -6, 832)]


def test_a_range_test_ended_early_reads_as_a_test_of_that_many_steps():
  """What --time-budget does to a range test (RangeTest.end_at): ended at 12
  of 100 steps, its losses, curve (window: a quarter of 12) and suggestion are
  those of a test of 12 steps of the same task, bitwise."""
  from purax.tune import lr_range
  task = purax.Task(model=purax.nn.MLP(features=(8,), num_classes=3),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=100, warmup_steps=0))
  state = task.init(jax.random.key(0), BATCHES[0])
  lrs = lr_range.log_grid(1e-3, 1.0, 3)
  results = []
  for steps, end in ((100, 12), (12, None)):
    test = lr_range.RangeTest(task, state, lrs=lrs, steps=steps, strategy='vmap')
    if end is not None:
      test.end_at(end)
    while test.done < test.end:
      test.step(BATCHES[test.done % 8])
    results.append(test.result())
  early, straight = results
  assert early.window == straight.window == 3
  np.testing.assert_array_equal(early.losses, straight.losses)
  assert early.suggestion == straight.suggestion
  with pytest.raises(lr_range.RangeTestError, match='steps: expected at least 8'):
    lr_range.RangeTest(task, state, lrs=lrs, steps=100).end_at(7)
