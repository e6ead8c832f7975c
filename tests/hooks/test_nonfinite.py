"""purax.hooks.NonFiniteReplay in fit: a skipped update is replayed on its
batch and named with its step; while every update is finite the loop makes
no host read or transfer more than without the hook."""

import warnings

import jax
import numpy as np
import pytest

import purax
from purax.core import metrics as metrics_lib
from purax.io.checkpoint import replay
from tests.helpers_nonfinite import MARK, LinenNet

TASK = purax.Task(model=LinenNet(), tx=purax.adamw(learning_rate=1e-2, total_steps=8))


def batch(i, marked_at=6):
  rng = np.random.default_rng(i)
  b = {'x': rng.normal(size=(4, 5)).astype(np.float32),
       'y': rng.integers(0, 3, 4).astype(np.int32)}
  if i == marked_at:
    b['x'][2, 0] = 2 * MARK
  return b


def run(data, steps=8, **standard):
  state = jax.jit(TASK.init)(jax.random.key(0), batch(0))
  hooks = purax.hooks.standard(progress=False, **standard)
  replays = [h for h in hooks if isinstance(h, purax.hooks.NonFiniteReplay)]
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    state, history = purax.fit(TASK, state, data, steps=steps, hooks=hooks)
  notes = [str(w.message) for w in caught if str(w.message).startswith('purax:')]
  return replays[0], notes, history


@pytest.mark.parametrize('log_every, debug_nans, replayed', [
    (7, False, True),     # update 6 skipped, the window (0, 7] ends in it: replayed
    (4, False, False),    # update 7 was taken after it: named, not replayed
    (4, True, True),      # --debug-nans: replayed at its step
])
def test_a_skipped_update_is_replayed_and_named_with_its_step(tmp_path, log_every, debug_nans,
                                                               replayed):
  directory = str(tmp_path / 'nonfinite')
  hook, notes, history = run([batch(i) for i in range(8)], log_every=log_every,
                             debug_nans=debug_nans, replay_dir=directory)
  assert sum(h.get('train/skipped', 0) for h in history) == 1
  if not replayed:
    assert hook.reports == [] and replay.saved_steps(directory) == []
    assert notes == ['purax: 1 update(s) in steps (4, 8] were skipped as non-finite and '
                     'training went on; their state is gone, so they cannot be replayed '
                     '(purax train --debug-nans, or purax.hooks.NonFiniteReplay(every_step=True'
                     '), replays each at its step)']
    return
  [report] = hook.reports
  assert (report.step, report.where, report.path) == (6, 'forward', 'block'), str(report)
  assert notes == [f'purax: non-finite {report}; saved in {directory}']
  # Saved: the state before update 6 and its batch replay to the same report.
  assert replay.saved_steps(directory) == [6]
  abstract = TASK.abstract_state(batch(0))
  state, saved_batch, saved = replay.load_update(directory, 6, abstract, batch(0))
  assert int(state.step) == 6 and saved == report.as_dict()
  np.testing.assert_array_equal(saved_batch['x'], batch(6)['x'])
  assert purax.find_nonfinite(TASK, state, saved_batch) == report


def test_an_iterable_s_batches_are_replayed_only_when_kept():
  gen = lambda: (batch(i) for i in range(8))   # noqa: E731
  hook, notes, _ = run(gen(), log_every=7)
  assert hook.reports == [] and 'its batch was not kept' in notes[0]
  state = jax.jit(TASK.init)(jax.random.key(0), batch(0))
  kept = purax.hooks.NonFiniteReplay(7, keep=8)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    purax.fit(TASK, state, gen(), hooks=[purax.hooks.Log(7), kept])
  assert [(r.step, r.path) for r in kept.reports] == [(6, 'block')]


def test_with_every_update_finite_the_hook_adds_no_host_read_or_transfer(monkeypatch):
  """Counted: every jax.device_get and metrics fetch of a run with the
  standard hooks equals the count without NonFiniteReplay, under a transfer
  guard that refuses any implicit transfer."""
  data = [batch(i, marked_at=None) for i in range(8)]
  counts = []
  for keep_hook in (True, False):
    calls = []
    real_get, real_compute = jax.device_get, metrics_lib.compute
    monkeypatch.setattr(jax, 'device_get', lambda x: calls.append('get') or real_get(x))
    monkeypatch.setattr(metrics_lib, 'compute', lambda m: calls.append('fetch') or real_compute(m))
    hooks = [h for h in purax.hooks.standard(log_every=2, progress=False)
             if keep_hook or not isinstance(h, purax.hooks.NonFiniteReplay)]
    assert any(isinstance(h, purax.hooks.NonFiniteReplay) for h in hooks) == keep_hook
    state = jax.jit(TASK.init)(jax.random.key(0), batch(0))
    with jax.transfer_guard('disallow'):
      purax.fit(TASK, state, data, hooks=hooks, steps_per_call=1)
    monkeypatch.undo()
    counts.append(calls)
  assert counts[0] == counts[1] and counts[0].count('fetch') == 4
