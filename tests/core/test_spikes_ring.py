"""The spike guard's window is a ring of the last ``window`` finite steps:
after more than ``window`` steps, SpikeGuard.check decides exactly as the
rule on the last ``window`` values does (a reference in numpy), so a lasting
change of level is learnt within a window."""

import jax
import numpy as np

import purax
from purax.core.spikes import STD_FLOOR

WINDOW, K = 4, 3.0


def reference(history, current):
  """The module docstring's rule on the last WINDOW values of ``history``."""
  last = np.asarray(history[-WINDOW:], np.float64).reshape(-1, 2)
  if len(last) < max(2, WINDOW // 2):
    return False
  limit = last.mean(axis=0) + K * np.maximum(last.std(axis=0), STD_FLOOR)
  return bool(np.any(np.asarray(current) > limit))


def test_after_more_than_window_steps_the_guard_judges_by_the_last_window_values():
  guard = purax.SpikeGuard(window=WINDOW, k=K)
  check = jax.jit(guard.check)
  rng = np.random.default_rng(0)
  # Two levels: 1 for 6 steps, then 10 for 9 (more than 3 windows in all), then
  # 11: a spike against the last WINDOW values (all near 10), not against a
  # window that still held the first level.
  losses = [1.0 + 0.05 * rng.normal() for _ in range(6)] + [
      10.0 + 0.05 * rng.normal() for _ in range(9)] + [11.0]
  window, history, decided = guard.init(), [], []
  for loss in losses:
    current = (np.float32(loss), np.float32(1.0))
    spike, window = check(window, *current)
    assert bool(spike) == reference(history, current), (len(history), loss)
    decided.append(bool(spike))
    history.append(current)
  assert int(window.size) == WINDOW
  # The jump to 10 is a spike, then learnt: once the window holds only the new
  # level (WINDOW steps after the jump, a wrap of the ring), no more spikes.
  assert decided[6] and not any(decided[6 + WINDOW:-1]) and decided[-1], decided
