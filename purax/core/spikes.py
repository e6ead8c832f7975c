"""The loss-spike guard: skip an update whose loss or gradient norm is far
above its recent history, as pure state.

A :class:`SpikeGuard` (static: the window's length and ``k``) given to
:class:`purax.Task` (``spike_guard=``) makes every step compare the batch's
loss and gradient global norm with the mean and standard deviation of the
last ``window`` steps' values, kept in ``state.guards['spikes']`` (a
:class:`SpikeWindow`, so a resumed run continues with the same history). A
step is a spike when the window holds at least :attr:`SpikeGuard.min_history`
values and

    loss > mean(loss) + k * std(loss)   or   grad_norm > mean(gn) + k * std(gn)

(standard deviations floored at 1e-6). A spike's update is skipped by the
guards' one ``lax.cond`` (:mod:`purax.core.guards`): params,
optimizer state and model state stay bitwise as they were, ``state.step``
advances, and the step counts in ``metrics['spikes']`` (logged as
``train/spikes``) and nowhere else. Every step's finite values enter the
window after the decision, spikes included, so a lasting change of level is
learnt within about a window instead of freezing training (the rule of
OLMo-core's and Levanter's skip-step optimizers, which this follows;
MaxText's ``skip_step_on_spikes`` is the same idea on the loss alone).
Non-finite values never enter it (the non-finite guard skips those steps).

Example:
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20),
  ...                   spike_guard=purax.SpikeGuard(window=128, k=6.0))
  >>> state = task.init(jax.random.key(0), batch)
  >>> state, metrics = jax.jit(task.step)(state, batch)
  >>> purax.metrics.compute(metrics)['spikes']      # too little history to judge yet
  0.0
  >>> int(state.guards['spikes'].size)               # this step's loss and norm entered it
  1
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp
from flax import struct

from purax.core.errors import ConfigError, expect, expect_kind

#: The longest window: its state is 128 MiB (a window of a billion steps
#: would need 7.45 GiB per member, and compares with history no run has).
MAX_WINDOW = 2 ** 24


def window_bytes(window: int) -> int:
  """Bytes of one member's :class:`SpikeWindow` of ``window`` steps
  (``values`` float32 ``[window, 2]``, ``size`` and ``index``)."""
  return 8 * int(window) + 8


#: Floor of the standard deviations: a window of equal values still lets an
#: update through whose value is equal up to float32 rounding.
STD_FLOOR = 1e-6


class SpikeWindow(struct.PyTreeNode):
  """The recent history the spike guard compares with (``state.guards['spikes']``).

  Attributes:
    values: float32 ``[window, 2]``: ``(loss, grad_norm)`` of the last
      ``window`` steps with finite values, a ring (slot order is not time order).
    size: int32 ``[]``: the filled slots (``<= window``).
    index: int32 ``[]``: the slot written next.
  """

  values: jax.Array
  size: jax.Array
  index: jax.Array


@dataclasses.dataclass(frozen=True)
class SpikeGuard:
  """Skip updates whose loss or gradient norm exceeds the rolling mean plus
  ``k`` standard deviations (see the module docstring).

  Attributes:
    window: steps of history (in ``[2, MAX_WINDOW]``); the guard acts once
      :attr:`min_history` of them are filled.
    k: standard deviations above the mean that make a spike (> 0, finite).

  Raises (at construction):
    ConfigError: ``window`` or ``k`` out of range, naming it.
  """

  window: int = 128
  k: float = 6.0

  def __post_init__(self):
    expect_kind(self.window, 'spike_guard.window', int, 'an integer >= 2')
    expect(not isinstance(self.window, bool) and 2 <= self.window <= MAX_WINDOW,
           'spike_guard.window', f'an integer in [2, 2**24 = {MAX_WINDOW}]',
           f'{self.window}' + (f' (its state would need {window_bytes(self.window) / 2 ** 30:.2f} '
                               'GiB)' if self.window > MAX_WINDOW else ''), ConfigError)
    expect_kind(self.k, 'spike_guard.k', numbers.Real, 'a number > 0')
    expect(math.isfinite(self.k) and self.k > 0, 'spike_guard.k', 'a finite number > 0',
           self.k, ConfigError)

  @property
  def min_history(self) -> int:
    """Values the window must hold before the guard skips anything: half of it (at least 2)."""
    return max(2, self.window // 2)

  def init(self) -> SpikeWindow:
    """An empty window."""
    return SpikeWindow(values=jnp.zeros((self.window, 2), jnp.float32),
                       size=jnp.zeros((), jnp.int32), index=jnp.zeros((), jnp.int32))

  def check(self, window: SpikeWindow, loss: jax.Array, grad_norm: jax.Array
            ) -> tuple[jax.Array, SpikeWindow]:
    """``(spike, window)``: whether this step is a spike (bool ``[]``), and the
    window with its values recorded (when both are finite). Traceable.

    Args:
      window: ``state.guards['spikes']``.
      loss: the batch's weighted mean loss, float32 ``[]``.
      grad_norm: the gradients' global norm, float32 ``[]``.

    Raises:
      ConfigError: ``window`` is not a :class:`SpikeWindow` of this guard's
        length (a state made by a task without this ``spike_guard``).
    """
    expect(isinstance(window, SpikeWindow) and window.values.shape[-2:] == (self.window, 2),
           "state.guards['spikes']", f'a SpikeWindow of window={self.window} (the state of '
           'task.init of a task with this spike_guard)',
           type(window).__name__ if not isinstance(window, SpikeWindow)
           else f'window={window.values.shape[-2]}', ConfigError)
    current = jnp.stack([jnp.asarray(loss, jnp.float32), jnp.asarray(grad_norm, jnp.float32)])
    filled = (jnp.arange(self.window) < window.size)[:, None]
    n = jnp.maximum(window.size, 1).astype(jnp.float32)
    mean = jnp.sum(jnp.where(filled, window.values, 0.0), axis=0) / n
    var = jnp.sum(jnp.where(filled, jnp.square(window.values - mean[None, :]), 0.0),
                  axis=0) / n
    limit = mean + self.k * jnp.maximum(jnp.sqrt(var), STD_FLOOR)
    finite = jnp.all(jnp.isfinite(current))   # else the non-finite guard's, not a spike
    spike = (window.size >= self.min_history) & jnp.any(current > limit) & finite
    recorded = SpikeWindow(
        values=window.values.at[window.index].set(jnp.where(finite, current,
                                                            window.values[window.index])),
        size=jnp.where(finite, jnp.minimum(window.size + 1, self.window), window.size),
        index=jnp.where(finite, (window.index + 1) % self.window, window.index))
    return spike, recorded
