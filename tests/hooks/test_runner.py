"""The loop of hooks: every hook sees true step numbers under any
steps_per_call, one cadence rule (purax.hooks.due), each end() once, and the
profiled steps annotated exactly."""

import glob
import gzip
import json
import os

import hypothesis
import jax
import pytest
from hypothesis import strategies as st

import purax
from purax import hooks as hooks_lib
from purax import plan as plan_lib
from purax.io import profile
from tests.helpers import tiny_batch, tiny_task

STEPS = 24
TASK = tiny_task('mlp', total_steps=STEPS)
DATA = [tiny_batch(seed=s) for s in range(STEPS)]


def fresh():
  return jax.jit(TASK.init)(jax.random.key(0), DATA[0])


class Recorder:
  """A user hook that records the steps its cadence called it at, and its final calls."""

  def __init__(self, every):
    self.every, self.steps, self.ends, self.name = every, [], [], 'rec'

  def __call__(self, info):
    assert int(jax.device_get(info.state.step)) == info.step   # the true step, not a call count
    assert dict(info.metrics) is not info.metrics              # read-only: a copy to change
    with pytest.raises(TypeError):
      info.metrics['x'] = 1.0
    if not info.forced:
      self.steps.append(info.step)
    if info.end is not None:
      self.ends.append((info.step, info.forced, info.end.status))


class LegacyRecorder:
  """A hook of the protocol before 0.3: (step, state, record), at_end, end(loop)."""

  def __init__(self, every, at_end=False):
    self.every, self.at_end, self.steps, self.ends, self.name = every, at_end, [], 0, 'old'

  def __call__(self, step, state, record):
    assert int(jax.device_get(state.step)) == step
    self.steps.append(step)
    return state, {'old/step': float(step)}

  def end(self, loop):
    self.ends += 1


@pytest.mark.parametrize('k', [1, 4])
def test_a_hook_sees_the_true_steps_of_its_cadence_whatever_the_steps_per_call(k):
  hooks = [Recorder(4), Recorder(8), Recorder(None), Recorder(0)]
  _, history = purax.fit(TASK, fresh(), DATA, steps=22, steps_per_call=k,
                         hooks=purax.hooks.standard(log_every=4, progress=False,
                                                    eval_data=DATA[:1], eval_every=8) + hooks)
  every4, every8, each_call, after_eval = hooks
  assert every4.steps == [4, 8, 12, 16, 20]
  assert every8.steps == [8, 16]
  # once before the first call; calls of 4 end at 4, 8, ..., 20; 21 and 22 (the tail) run singly
  assert each_call.steps == (list(range(0, 23)) if k == 1 else [0, 4, 8, 12, 16, 20, 21, 22])
  assert after_eval.steps == [8, 16, 22]                   # evaluations: 8, 16 and the end
  # The one final call: every hook, at the last step, with the end; forced
  # where its cadence did not call it there.
  assert every4.ends == every8.ends == [(22, True, 'finished')]
  assert each_call.ends == after_eval.ends == [(22, False, 'finished')]
  assert history.end.status == 'finished' and history.end.step == 22


def test_a_hook_of_the_old_protocol_runs_with_a_deprecation_warning():
  """Hooks written before 0.3 keep working until 0.4: their cadence, at_end
  (the last step, when the run finished), end(loop) once, their numbers written."""
  hooks = [LegacyRecorder(8), LegacyRecorder(8, at_end=True)]
  with pytest.warns(DeprecationWarning, match=r'protocol before 0.3.*StepInfo'):
    _, history = purax.fit(TASK, fresh(), DATA, steps=22,
                           hooks=purax.hooks.standard(log_every=4, progress=False) + hooks)
  plain, at_end = hooks
  assert plain.steps == [8, 16] and at_end.steps == [8, 16, 22]
  assert plain.ends == at_end.ends == 1
  assert [r['step'] for r in history if 'old/step' in r] == [8, 16, 22]


def test_a_cadence_that_is_not_a_multiple_of_steps_per_call_is_a_named_error():
  # every=3 cannot be honoured with calls of 4 steps (they end at 4, 8, 12):
  # refused before anything runs, naming the hook.
  with pytest.raises(purax.ConfigError,
                     match=r'rec.every: expected a multiple of steps_per_call=4 .*got 3'):
    purax.fit(TASK, fresh(), DATA, steps_per_call=4,
              hooks=purax.hooks.standard(log_every=4, progress=False) + [Recorder(3)])
  with pytest.raises(purax.ConfigError, match=r'log_every: expected a multiple of '
                                              r'steps_per_call=4'):
    purax.fit(TASK, fresh(), DATA, steps_per_call=4,
              hooks=purax.hooks.standard(log_every=6, progress=False))


def test_auto_picks_a_steps_per_call_that_divides_every_cadence(monkeypatch):
  # 'auto' offered k = 4 by the rule, but a hook every 3 steps: the cadence it
  # is asked to divide is gcd(4, 3) = 1, and the hook runs at 3, 6, 9, ...
  offered = []
  monkeypatch.setattr(plan_lib.auto, 'choose_steps_per_call',
                      lambda *a, **kw: offered.append(a[3]) or 1)
  hook = Recorder(3)
  purax.fit(TASK, fresh(), DATA, steps=12,
            hooks=purax.hooks.standard(log_every=4, progress=False) + [hook])
  assert set(offered) == {1} and hook.steps == [3, 6, 9, 12]


def test_due_is_the_one_cadence_rule():
  due = hooks_lib.due
  assert due(4, 3, 4) and due(4, 0, 8) and not due(4, 4, 7) and due(4, 7, 9)
  assert due(None, 5, 6) and not due(0, 0, 4) and due(0, 0, 4, evaluated=True)
  assert due(4, 20, 22, at_end=True) and not due(4, 20, 22)


def traced_steps(logdir):
  (trace,) = glob.glob(os.path.join(logdir, 'plugins', 'profile', '*', 'perfetto_trace.json.gz'))
  with gzip.open(trace) as f:
    events = json.load(f)
  events = events['traceEvents'] if isinstance(events, dict) else events
  return sorted(int(e['args']['step_num']) for e in events if e.get('name') == profile.STEP_NAME)


@pytest.mark.parametrize('k', [4, 'auto'])
def test_the_profiled_steps_run_alone_and_are_annotated_exactly(tmp_path, monkeypatch, k):
  # Calls of 4 steps (forced for 'auto' too) would cover state.step 4-7 in one
  # call; the profile's steps run one per call instead, the rest stays in calls
  # of 4, and the trace holds exactly the annotations 13, 14, 15.
  monkeypatch.setattr(plan_lib.auto, 'choose_steps_per_call', lambda *a, **kw: 4)
  # 'auto' times its first calls of 4 and may go back to single steps on a slow,
  # noisy machine: that decision is a measurement, made here to keep k = 4.
  monkeypatch.setattr(plan_lib.auto, 'k_pays', lambda *a: True)
  sizes = []
  real = plan_lib.single.multi_train_step
  monkeypatch.setattr(plan_lib.single, 'multi_train_step',
                      lambda *a: sizes.append(jax.tree.leaves(a[3])[0].shape[0]) or real(*a))
  state, _ = purax.fit(TASK, fresh(), DATA, steps_per_call=k, hooks=purax.hooks.standard(
      log_every=4, progress=False, profile=(13, 16), profile_dir=str(tmp_path)))
  assert int(state.step) == STEPS
  assert traced_steps(tmp_path) == [13, 14, 15]
  # k=4: 0-3, 4-7, 8-11 and 16-19, 20-23 in calls of 4; 'auto': its 5 probe
  # steps, then 5-7 single, 8-11, then 16-19 and 20-23.
  assert sizes == ([4, 4, 4, 4, 4] if k == 4 else [4, 4, 4])


def test_one_shot_eval_data_is_refused_where_it_would_be_iterated_twice():
  with pytest.raises(purax.ConfigError, match=r'eval_data: expected a collection iterated '
                                              r'afresh at every evaluation .*got a one-shot'):
    purax.hooks.standard(eval_data=iter(DATA[:1]), eval_every=4)
  _, history = purax.fit(TASK, fresh(), DATA, steps=8, hooks=purax.hooks.standard(
      log_every=4, progress=False, eval_data=iter(DATA[:1])))     # one evaluation: the end
  assert [r['step'] for r in history if 'eval/loss' in r] == [8]


@hypothesis.given(st.lists(st.sampled_from([1, 2, 3, 4, 5, 8, 10, 50]), min_size=1, max_size=4),
                  st.integers(0, 120), st.integers(1, 17))
def test_next_due_is_where_due_first_holds(every, first, taken):
  """The loop skips the hooks of a call that ends before next_due(cadences,
  first): exactly the calls after which no hook of those cadences is due."""
  last = first + taken
  assert (last >= hooks_lib.next_due(every, first)) == any(
      hooks_lib.due(n, first, last) for n in every)


def test_a_call_with_no_hook_due_asks_no_hook(monkeypatch):
  """Between log points the loop runs the step and nothing else: the cadence
  rule is consulted once per hook at each log point (and the end), not once
  per hook per call."""
  from purax.hooks import runner as loop_lib
  asked = []
  real = loop_lib.due
  monkeypatch.setattr(loop_lib, 'due', lambda *a, **kw: asked.append(a[2]) or real(*a, **kw))
  purax.fit(TASK, fresh(), DATA, steps=STEPS, steps_per_call=1,
            hooks=purax.hooks.standard(log_every=8, progress=False, max_consecutive_skips=None))
  # NonFiniteReplay's cadence at 8 and 16 (Log, every=None, runs after every call
  # that reached one); the final call asks each hook once (Log and NonFiniteReplay).
  assert asked == [8, 16, 24, 24]
