"""The metrics window of purax.fit (purax.hooks.window.Reader), read at each log
point: steps_per_sec leaves out the compilation (compile_s) and the hooks' time,
and counts the steps still queued at the log point (once, also at the end of
the data); a log point fetches the window and the hyperparameters in one
transfer. On a fake clock: counts, never wall times."""

import time

import jax

import purax
from purax.io import compile_time
from purax.plan import SingleDevicePlan
from tests.helpers_log import DATA, task


class FakeClock:
  """time.perf_counter and compile_time.seconds, advanced by the fake plan and hook."""

  def __init__(self):
    self.now, self.compiled = 1000.0, 0.0

  def advance(self, seconds, compiling=0.0):
    self.now += seconds
    self.compiled += compiling


class ClockedPlan(SingleDevicePlan):
  """One second per step; the first call also compiles for 100 s."""

  def __init__(self, task, clock):
    super().__init__(task)
    self.clock, self.made = clock, 0

  def train_step(self, state, acc, batch):
    self.made += 1
    self.clock.advance(1.0 + (100.0 if self.made == 1 else 0.0),
                       100.0 if self.made == 1 else 0.0)
    return super().train_step(state, acc, batch)


class SlowHook:
  """A hook of 50 s, 20 of them compiling (an evaluation's first compilation)."""
  every, name = 2, 'slow'

  def __init__(self, clock):
    self.clock = clock

  def __call__(self, info):
    if info.step == 2 and not info.forced:
      self.clock.advance(50.0, 20.0)


def test_steps_per_sec_leaves_out_the_compilation_and_the_hooks_by_construction(monkeypatch):
  clock = FakeClock()
  t = task((11,))
  state = t.init(jax.random.key(0), DATA[0])
  monkeypatch.setattr(time, 'perf_counter', lambda: clock.now)
  monkeypatch.setattr(compile_time, 'seconds', lambda: clock.compiled)
  _, history = purax.fit(t, state, DATA[:6], plan=ClockedPlan(t, clock), steps_per_call=1,
                         hooks=purax.hooks.standard(log_every=3, progress=False)
                         + [SlowHook(clock)])
  logs = [r for r in history if 'train/loss' in r]
  # Window 1: 3 steps in 153 s = 3 of stepping + 100 of compiling + 50 of a hook
  # (20 of it compiling: hook time, counted once); window 2: 3 steps in 3 s.
  assert [r['steps_per_sec'] for r in logs] == [1.0, 1.0]
  assert logs[0]['compile_s'] == 100.0 and 'compile_s' not in logs[1]


def queued_clock(monkeypatch, wait: float = 10.0) -> FakeClock:
  """A FakeClock behind time.perf_counter and compile_time.seconds, advanced
  ``wait`` seconds by every jax.device_get that transfers an array (the wait
  for the steps queued on the device; host values transfer nothing)."""
  clock, real_get = FakeClock(), jax.device_get

  def queued(x):
    if any(isinstance(a, jax.Array) for a in jax.tree.leaves(x)):
      clock.advance(wait)
    return real_get(x)
  monkeypatch.setattr(time, 'perf_counter', lambda: clock.now)
  monkeypatch.setattr(compile_time, 'seconds', lambda: clock.compiled)
  monkeypatch.setattr(jax, 'device_get', queued)
  return clock


def test_steps_per_sec_counts_the_steps_still_queued_at_the_log_point(monkeypatch):
  """A call returns before the device has run its step (dispatch is
  asynchronous), so steps are still queued when a log point waits for the
  metrics: that wait is step time, not hook time. Faked: each call returns
  after 1 s of host time, and each log point's fetch waits 10 s for the
  queue."""
  clock = queued_clock(monkeypatch)
  t = task((10,))
  state = t.init(jax.random.key(0), DATA[0])
  _, history = purax.fit(t, state, DATA[:6], plan=ClockedPlan(t, clock), steps_per_call=1,
                         hooks=[purax.hooks.Log(3)])
  # Each window: 3 steps, 3 s of calls and 10 s of waiting for them (the
  # first window's 100 s of compiling left out, as compile_s).
  assert [r['steps_per_sec'] for r in history] == [3 / 13, 3 / 13]
  assert history[0]['compile_s'] == 100.0


def test_the_log_point_at_the_end_of_the_data_counts_its_wait_once(monkeypatch):
  """The last log point of an iterable that runs out between log points
  runs from the hook's ``end``, outside the timed hook round: its wait is
  already in the wall time. Faked as above: 7 batches, log every 3."""
  clock = queued_clock(monkeypatch)
  t = task((9,))
  state = t.init(jax.random.key(0), DATA[0])
  _, history = purax.fit(t, state, (b for b in DATA[:7]), plan=ClockedPlan(t, clock),
                         steps_per_call=1, hooks=[purax.hooks.Log(3)])
  assert [r['step'] for r in history] == [3, 6, 7]
  assert [r['steps_per_sec'] for r in history] == [3 / 13, 3 / 13, 1 / 11]


def test_a_log_point_fetches_the_window_and_the_hyperparameters_in_one_transfer(monkeypatch):
  """Counted: the arrays jax.device_get brings to the host in a fit whose only
  hook is Log: at each of its 4 log points the metrics window and one packed
  array of the 8 hyperparameters; the initial hyperparameters once (each
  hyperparameter read on its own was 17 arrays per log point)."""
  t = task((12,))
  state = t.init(jax.random.key(0), DATA[0])
  fetched = []
  real_get = jax.device_get
  monkeypatch.setattr(jax, 'device_get', lambda x: fetched.append(
      sum(isinstance(a, jax.Array) for a in jax.tree.leaves(x))) or real_get(x))
  _, history = purax.fit(t, state, DATA[:8], steps_per_call=1, hooks=[purax.hooks.Log(2)])
  monkeypatch.undo()
  assert [r['step'] for r in history] == [2, 4, 6, 8]
  # The log points' (the window computed on the host reads no array).
  assert [n for n in fetched if n][-4:] == [3, 2, 2, 2]
  assert history[-1]['train/learning_rate'] > 0
