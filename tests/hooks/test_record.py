"""The step record and the run's end (purax/hooks/record.py): what a hook
sees is read-only; an end says itself once, round-trips through JSON (a
checkpoint, final_metrics.json) and refuses an unknown status."""

import math

import jax
import pytest

import purax
from purax.hooks.record import End, StepInfo
from tests.helpers import tiny_batch, tiny_task

TASK = tiny_task('mlp', total_steps=12)
DATA = [tiny_batch(seed=s) for s in range(12)]


def test_an_end_round_trips_through_json_and_says_itself():
  end = End('early_stopped', 30, 'eval/loss did not improve', metric='eval/loss', best=0.25,
            best_step=10)
  assert End.from_dict(end.as_dict()) == end
  assert end.as_dict() == {'status': 'early_stopped', 'step': 30,
                           'reason': 'eval/loss did not improve', 'metric': 'eval/loss',
                           'best': 0.25, 'best_step': 10}
  assert end.words() == 'early_stopped at step 30: eval/loss did not improve'
  assert end.done and End('finished', 3).done
  assert not End('stopped', 3, signal='SIGTERM').done and not End('failed', 3).done
  nan = End('early_stopped', 4, best=math.nan)
  assert nan.as_dict()['best'] == 'nan' and math.isnan(End.from_dict(nan.as_dict()).best)
  with pytest.raises(ValueError, match=r"status: expected one of .*got 'done'"):
    End('done', 3)
  with pytest.raises(ValueError, match=r'end: expected \{"status", "step", ...\}'):
    End.from_dict({'status': 'finished'})


def test_the_record_is_read_only():
  info = StepInfo(first=0, step=1, state=None, metrics={'train/loss': 1.0})
  with pytest.raises(TypeError):
    info.metrics['train/loss'] = 2.0
  with pytest.raises(AttributeError):
    info.step = 2
  assert not info.evaluated and StepInfo(0, 1, None, {'eval/loss': 1.0}).evaluated
  with pytest.raises(ValueError, match='StepInfo.checkpoint: expected a record made by'):
    info.checkpoint()


class Ends:
  """Stops the run at ``at`` (a hook's own decision) and records the final call."""

  every, name = 1, 'ends'

  def __init__(self, at):
    self.at, self.final = at, []

  def __call__(self, info):
    if info.end is not None:
      self.final.append((info.step, info.end.status, info.forced))
      return None
    if info.step == self.at:
      return purax.hooks.Output(stop=End('early_stopped', info.step, 'enough'))
    return None


class Boom:
  every, name = 5, 'boom'

  def __call__(self, info):
    if info.end is None:
      raise RuntimeError('boom')


def fresh():
  return jax.jit(TASK.init)(jax.random.key(0), DATA[0])


@pytest.mark.parametrize('how', ['finished', 'early_stopped', 'data', 'failed'])
def test_every_way_a_run_ends_is_one_end_said_to_every_hook_once(how):
  """The end is decided once (fit's history.end) and every hook gets one final
  call with it at the last step: steps reached, a hook's stop, the data
  running out, an error (the run's own error goes on)."""
  ends = Ends(at=7 if how == 'early_stopped' else -1)
  data = iter(DATA[:9]) if how == 'data' else DATA    # an iterable that runs out at 9
  hooks = [ends] + ([Boom()] if how == 'failed' else [])
  if how == 'failed':
    with pytest.raises(RuntimeError, match='boom'):
      purax.fit(TASK, fresh(), data, steps=12, hooks=hooks)
    assert ends.final == [(5, 'failed', True)]
    return
  state, history = purax.fit(TASK, fresh(), data, steps=12, hooks=hooks)
  step = {'finished': 12, 'early_stopped': 7, 'data': 9}[how]
  status = 'early_stopped' if how == 'early_stopped' else 'finished'
  assert int(state.step) == step
  assert (history.end.status, history.end.step) == (status, step)
  assert history.end.reason == {'finished': 'reached step 12', 'early_stopped': 'enough',
                                'data': 'the data ran out'}[how]
  # At 12 the final call is its cadence's; at 7 (it stopped the run) and at 9 (the
  # data ran out after the call) it had run on its cadence already: forced.
  assert ends.final == [(step, status, how != 'finished')]
