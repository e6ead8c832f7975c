"""orbax policies: keep-best by a recorded metric, and the wall-clock cadence."""

from __future__ import annotations

import datetime

import numpy as np
from orbax.checkpoint import checkpoint_managers as orbax_policies

from purax.core.metrics import Best, to_minimise


# -- keep-best --------------------------------------------------------------------


class BestOfRecorded:
  """orbax preservation policy: keep the ``n`` best steps by a metric recorded
  per step in ``scores`` (read back from each checkpoint's JSON, so a new
  ``Checkpointer`` decides as the one before it did), ranked by ``rule`` (a
  :class:`purax.core.metrics.Best`: the one rule of keep-best and early
  stopping). Steps without a finite score do not compete."""

  def __init__(self, n: int, scores: dict[int, float], rule: Best):
    self.n, self.scores, self.rule = n, scores, rule

  def should_preserve(self, checkpoints, *, context):
    del context
    scored = sorted((float(to_minimise(self.scores[c.step], self.rule.mode)), c.step)
                    for c in checkpoints if np.isfinite(self.scores.get(c.step, np.nan)))
    best = {step for _, step in scored[:self.n]}   # best first; ties: the older step
    return [c.step in best for c in checkpoints]


class IntervalSinceStart:
  """orbax save-decision policy: at least ``seconds`` since the last save, the
  clock starting at this ``Checkpointer``'s creation.

  orbax's ``ContinuousCheckpointingPolicy(minimum_interval_secs=...)`` decides
  (no save while one is still being written; on several hosts process 0
  decides and the others follow it); it is given the later of the newest
  checkpoint and the creation time as the previous save, because on its own it
  saves at once in an empty directory and at the first check after every
  resume — a save that a short run pays for and does not need.
  """

  def __init__(self, seconds: float):
    self.inner = orbax_policies.ContinuousCheckpointingPolicy(minimum_interval_secs=seconds)
    self.started = _Info(step=-1, time=datetime.datetime.now(tz=datetime.timezone.utc))

  def should_save(self, step, previous_steps, *, context):
    last = previous_steps[-1] if previous_steps else None
    anchor = last if last is not None and last.time >= self.started.time else self.started
    return self.inner.should_save(step, [anchor], context=context)


class _Info:
  """A ``PolicyCheckpointInfo``: the step, time and metrics of a save."""

  def __init__(self, step: int, time: datetime.datetime, metrics=None):
    self.step, self.time, self.metrics = step, time, metrics


# The wall-clock cadence a Checkpointer saves at by default (see ``interval_s``).
DEFAULT_INTERVAL_S = 300.0


