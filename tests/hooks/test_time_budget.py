"""``--time-budget``'s hook (:class:`purax.hooks.TimeBudget`): the duration
parsed, the steps planned from the measured step time (on a fake clock: counts,
never wall times), the planning rule shared with ``purax tune lr``, and the
named errors of a bad or too short budget. The verdict of a run on a budget:
tests/app/test_verdict.py."""

import math

import jax
import numpy as np
import pytest

import purax
from purax import hooks as hooks_lib
from purax.app.config import TrainConfig
from purax.core.errors import ConfigError
from purax.hooks.time_budget import REASON, TimeBudget, ended_by_budget, parse_duration
from purax.io.checkpoint.run import Restored
from tests.helpers_budget import BATCHES, EVAL, TASK


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


def run(budget_s, fake, *, state=None, steps=100_000, log_every=50, tail_s=1.0, last_step=None):
  budget = TimeBudget(budget_s, started=fake.start, eval_data=EVAL, tail_s=tail_s,
                      clock=fake.clock, compiled=fake.compiled, last_step=last_step)
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


def test_the_run_ends_at_the_last_step_however_much_budget_is_left():
  fake = FakeTime()                        # 832 steps would fit (the test above)
  state, history, budget = run(16.0, fake, last_step=300)
  assert budget.plans[0] == (4, 2 ** -6, 300) and int(state.step) == 300 == history.end.step
  assert history.end.reason.startswith(f"{REASON} of 16 s: 300 steps (its last step)")
  state, history, budget = run(16.0, FakeTime(), last_step=2000)    # the budget comes first
  assert int(state.step) == 832 and "schedule's end" not in history.end.reason
  with pytest.raises(ConfigError, match='last_step: expected None or an integer >= 1, got 0'):
    TimeBudget(16.0, last_step=0)


def test_a_run_resumed_at_its_last_step_trains_nothing():
  fake = FakeTime()
  state, history, _ = run(16.0, fake, last_step=20)
  assert int(state.step) == 20
  # Resumed there (a new budget): no call, not even the compiling one.
  state, history, budget = run(16.0, FakeTime(), state=state, last_step=20)
  assert int(state.step) == 20 and history.end.status == 'finished'
  assert history.end.reason == f'{REASON} of 16 s: step 20 is its last step; nothing to train'
  assert budget.compile_s is None and budget.plans == []


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
  with pytest.raises(ConfigError, match=r'time_budget: expected at least 16\.0 s \(15\.0 s '
                                        r'of start-up and compilation, the compilation 15\.0 s '
                                        r'of it; one step; and 1\.0 s'):
    run(16.0, fake)
  spent = FakeTime(start=100.0)            # start-up spent the budget before any call
  budget = TimeBudget(1.0, started=90.0, tail_s=0.5, clock=spent.clock)
  with pytest.raises(ConfigError, match=r'time_budget: expected more than the 10\.0 s the '
                                        r'start-up took'):
    purax.fit(TASK, TASK.init(jax.random.key(0), BATCHES[0]), Data(10), hooks=[budget])


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
