"""The Log hook (issue 29.3): the learning rate the last update applied and
any hyperparameter that changed, at every log point; compilation reported as
compile_s and left out of steps_per_sec."""

import time

import jax
import numpy as np
import pytest

import purax
from purax.core.optim import warmup_cosine
from purax.io import compile_time
from purax.plan import SingleDevicePlan
from tests.helpers import tiny_batch

PEAK, WARMUP, STEPS = 1e-2, 4, 12
DATA = [tiny_batch(seed=s) for s in range(STEPS)]


def task(features=(13,)):
  """An MLP no other test compiles (its first fit here compiles for sure)."""
  return purax.Task(model=purax.nn.MLP(num_classes=10, features=features),
                    tx=purax.adamw(learning_rate=PEAK, total_steps=STEPS, warmup_steps=WARMUP))


class SetWeightDecay:
  every, name = 6, 'set_wd'

  def __call__(self, info):
    if not info.forced:
      return purax.hooks.Output(state=purax.set_hyperparams(info.state, weight_decay=0.5))


def test_the_learning_rate_applied_and_changed_hyperparameters_at_every_log_point():
  t = task()
  state = t.init(jax.random.key(0), DATA[0])
  _, history = purax.fit(t, state, DATA, steps_per_call=1, hooks=purax.hooks.standard(
      log_every=3, progress=False) + [SetWeightDecay()])
  logs = [r for r in history if 'train/loss' in r]
  assert [r['step'] for r in logs] == [3, 6, 9, 12]
  schedule = warmup_cosine(PEAK, warmup_steps=WARMUP, total_steps=STEPS)
  # At step s the last update was the s-th: optax read its schedule at count s - 1.
  np.testing.assert_allclose([r['train/learning_rate'] for r in logs],
                             [float(schedule(s - 1)) for s in (3, 6, 9, 12)], rtol=1e-6)
  assert [r.get('train/weight_decay') for r in logs] == [None, None, 0.5, 0.5]
  # One name (issue #45): the stored peak is not logged beside the rate applied.
  assert not any('train/b1' in r or 'train/peak_learning_rate' in r for r in logs)
  # Count-based: the first window compiled the step (a compilation of its own
  # MLP), no later window did; the first throughput is not compilation.
  assert logs[0]['compile_s'] > 0 and not any('compile_s' in r for r in logs[1:])


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


def test_applied_learning_rate_is_the_one_optax_records_for_the_same_schedule():
  """The off-by-one against optax: inject_hyperparams stores the value its
  schedule gave the update it applied; purax.adamw's applied rate must equal it
  after every update (and 'learning_rate(opt_state)' is the next one's)."""
  import optax
  from purax.core import hparams
  schedule = warmup_cosine(PEAK, warmup_steps=WARMUP, total_steps=STEPS)
  reference = optax.inject_hyperparams(optax.sgd)(learning_rate=schedule)
  ours = purax.adamw(learning_rate=PEAK, total_steps=STEPS, warmup_steps=WARMUP)
  params = {'w': np.ones((3,), np.float32)}
  grads = {'w': np.full((3,), 0.1, np.float32)}
  holder = lambda s: purax.TrainState(step=0, params=params, model_state={}, opt_state=s,  # noqa: E731
                                      rng=None, hparams={}, loss_scale=None)

  @jax.jit
  def update(ref_state, our_state):
    _, ref_state = reference.update(grads, ref_state, params)
    _, our_state = ours.update(grads, our_state, params)
    applied = hparams.get(holder(our_state), ours, applied=True)['learning_rate']
    return ref_state, our_state, applied, ref_state.hyperparams['learning_rate']

  ref_state, our_state = reference.init(params), ours.init(params)
  assert float(hparams.get(holder(our_state), ours, applied=True)['learning_rate']) == 0.0
  pairs = []
  for _ in range(STEPS):
    ref_state, our_state, applied, recorded = update(ref_state, our_state)
    pairs.append((applied, recorded))
  np.testing.assert_allclose(*np.asarray(pairs).T, rtol=1e-6)
  assert len({float(a) for a, _ in pairs}) > 3               # the schedule moved
  np.testing.assert_allclose(ours.learning_rate(our_state), schedule(STEPS), rtol=1e-6,
                             atol=1e-9)


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
