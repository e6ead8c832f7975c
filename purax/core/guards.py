"""The step's guards, each a small pure function; :func:`combine` makes them
one decision for the one branch of :func:`purax.core.update.step`.

A guard reads the step's :class:`Signals` (whether the loss, the gradients'
global norm and the hyperparameters are finite; the loss; the norm) and its
own state, and returns a :class:`Verdict`: ``ok`` (bool ``[]``: the update may
be applied), its new state and its metrics. The update is applied when every
guard's ``ok`` holds (``lax.cond``/select in :mod:`purax.core.loops`, the
params, optimizer and model state either updated or kept bitwise), and
``state.step`` advances either way. The guards:

- :func:`nonfinite`: skip an update whose loss, gradient norm or
  hyperparameters are not finite; metrics ``skipped`` (:class:`purax.metrics.Sum`) and
  ``skip_streak`` (``Streak``). It runs whenever any guard does (the
  branch never applies a non-finite update); ``skip_nonfinite=False`` turns
  it off only where no other guard runs.
- :func:`spikes` (:class:`purax.core.spikes.SpikeGuard`): skip a loss or
  gradient-norm spike; state the :class:`SpikeWindow`; metric ``spikes``.
- :func:`loss_scale` (:class:`purax.core.loss_scale.LossScale`): never
  skips; its state halves on a non-finite step and grows after a finite run;
  metric ``loss_scale`` (the scale this step applied).
- :func:`frozen`: a frozen population member's update is skipped; for it
  every other guard keeps its state and every guard metric is zero
  (:func:`combine`).

Guard state lives in one sub-tree, ``TrainState.guards``, a dict keyed by
the guard's name (:data:`LOSS_SCALE`, :data:`SPIKES`): a guard with state
adds a key there, not a field to :class:`purax.TrainState`. A stateless
guard has no key.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp

from purax.core import metrics as metrics_lib
from purax.core.loss_scale import LossScale
from purax.core.spikes import SpikeGuard, SpikeWindow

#: The key of :class:`LossScale` in ``TrainState.guards`` (and its metric's name).
LOSS_SCALE = 'loss_scale'
#: The key of the spike guard's :class:`SpikeWindow` in ``TrainState.guards``
#: (and its metric's name).
SPIKES = 'spikes'


class Signals(NamedTuple):
  """What every guard may read of a step (all traced scalars).

  Attributes:
    finite: bool ``[]``: the loss, the gradients' global norm and the
      state's hyperparameters are all finite.
    loss: float32 ``[]``: the batch's weighted mean loss.
    grad_norm: float32 ``[]``: the gradients' global norm.
  """

  finite: jax.Array
  loss: jax.Array
  grad_norm: jax.Array


class Verdict(NamedTuple):
  """A guard's answer.

  Attributes:
    ok: bool ``[]``: the update may be applied.
    state: the guard's new state (a pytree), or None for a stateless guard.
    metrics: ``{name: metric}`` (:mod:`purax.core.metrics` classes).
  """

  ok: jax.Array
  state: Any
  metrics: dict


#: ``guard(signals, state) -> Verdict``; ``state`` is the guard's entry of
#: ``TrainState.guards`` (None for a stateless guard).
Guard = Callable[[Signals, Any], Verdict]


def nonfinite(signals: Signals, state=None) -> Verdict:
  """Skip a step whose loss, gradient norm or hyperparameters are not finite."""
  del state
  skipped = jnp.logical_not(signals.finite)
  return Verdict(signals.finite, None, {'skipped': metrics_lib.Sum.of(skipped),
                                        'skip_streak': metrics_lib.Streak.of(skipped)})


def spikes(guard: SpikeGuard) -> Guard:
  """The guard of ``guard``'s spikes (:meth:`SpikeGuard.check`); its state is
  the :class:`SpikeWindow`, which records the step's values either way."""
  def check(signals: Signals, window: SpikeWindow) -> Verdict:
    spike, window = guard.check(window, signals.loss, signals.grad_norm)
    return Verdict(jnp.logical_not(spike), window, {SPIKES: metrics_lib.Sum.of(spike)})
  return check


def loss_scale(signals: Signals, scale: LossScale) -> Verdict:
  """Never skips: the scale's next state (:meth:`LossScale.update`) and the
  scale this step applied."""
  return Verdict(jnp.asarray(True), scale.update(signals.finite),
                 {LOSS_SCALE: metrics_lib.Average.of(scale.scale)})


def frozen(flag: jax.Array) -> Guard:
  """Skip a frozen member's update (``flag``: bool ``[]``); :func:`combine`
  keeps its other guards' state and zeroes their metrics."""
  return lambda signals, state: Verdict(jnp.logical_not(flag), None, {})


def of(state_guards: Mapping[str, Any], *, skip_nonfinite: bool = True,
       spike_guard: SpikeGuard | None = None, frozen_flag=None) -> dict[str, Guard]:
  """The guards a step runs, by name, in the order they decide: none when
  nothing asks for one (then the update needs no branch).

  Args:
    state_guards: ``TrainState.guards``; a :data:`LOSS_SCALE` entry turns the
      loss-scale guard on.
    skip_nonfinite: the non-finite guard (on anyway with any other guard).
    spike_guard: the spike guard, or None.
    frozen_flag: bool ``[]`` for a population member, or None.
  """
  found: dict[str, Guard] = {}
  if frozen_flag is not None:
    found['frozen'] = frozen(frozen_flag)
  if spike_guard is not None:
    found[SPIKES] = spikes(spike_guard)
  if state_guards.get(LOSS_SCALE) is not None:
    found[LOSS_SCALE] = loss_scale
  if found or skip_nonfinite:
    found = {'nonfinite': nonfinite, **found}
  return found


def combine(guards: Mapping[str, Guard], signals: Signals, state_guards: Mapping[str, Any],
            frozen_flag=None) -> Verdict:
  """Every guard's verdict as one: ``ok`` when each guard's is; the guards'
  new states by name (``TrainState.guards``, entries of no guard kept); their
  metrics. A frozen member (``frozen_flag``) keeps every guard's state, and its
  guard metrics are zero.
  """
  verdicts = {name: guard(signals, state_guards.get(name)) for name, guard in guards.items()}
  ok = functools.reduce(jnp.logical_and, [v.ok for v in verdicts.values()])
  states = {name: v.state for name, v in verdicts.items() if v.state is not None}
  metrics = {k: m for v in verdicts.values() for k, m in v.metrics.items()}
  if frozen_flag is not None:
    old = {name: state_guards[name] for name in states}
    states = jax.tree.map(lambda new, was: jnp.where(frozen_flag, was, new), states, old)
    metrics = jax.tree.map(lambda m: jnp.where(frozen_flag, jnp.zeros_like(m), m), metrics)
  return Verdict(ok, {**state_guards, **states}, metrics)
