"""What a hook sees and says: the read-only step record (:class:`StepInfo`), what
a hook gives back (:class:`Output`), and how a run ended (:class:`End`).

After each call of the plan's step, :func:`purax.fit` hands every due hook a
:class:`StepInfo` (levanter's ``StepInfo``; CLU's periodic actions): the step
range the call covered, the state, the numbers written at this step so far,
and, once the run has ended, its :class:`End`. A hook never sees the loop.
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any, Callable, Mapping

#: The four ways a run ends (:class:`End`).
STATUSES = ('finished', 'early_stopped', 'stopped', 'failed')

#: The statuses whose run is over: the same command trains nothing more
#: (``stopped`` resumes; ``failed`` is retried).
DONE = ('finished', 'early_stopped')


@dataclasses.dataclass(frozen=True)
class End:
  """How a run ended, decided once by the loop and said once.

  Attributes:
    status: ``'finished'`` (the steps reached, or the data ran out),
      ``'early_stopped'`` (a hook ended it: :class:`purax.hooks.EarlyStopping`
      with its ``metric``, ``best`` value and ``best_step``), ``'stopped'``
      (a signal, ``signal``: resumable) or ``'failed'`` (``error``).
    step: ``state.step`` when it ended (int).
    reason: one line in words (what ended it).
    metric, best, best_step: early stopping's metric, its best value and the
      step that had it.
    signal: the signal's name (``'SIGTERM'``) of a ``stopped`` run.
    error: ``'TypeName: message'`` of a ``failed`` run.

  Raises:
    ValueError: an unknown ``status``.
  """

  status: str
  step: int
  reason: str = ''
  metric: str | None = None
  best: float | None = None
  best_step: int | None = None
  signal: str | None = None
  error: str | None = None

  def __post_init__(self):
    if self.status not in STATUSES:
      raise ValueError(f'status: expected one of {STATUSES}, got {self.status!r}')

  @property
  def done(self) -> bool:
    """Whether the run is over (``finished`` or ``early_stopped``): nothing more to train."""
    return self.status in DONE

  def as_dict(self) -> dict:
    """JSON: ``{'status', 'step', 'reason', ...}`` without the unset fields
    (a non-finite ``best`` as a string, as in ``metrics.jsonl``)."""
    out = {}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if value is None:
        continue
      if isinstance(value, float) and not math.isfinite(value):
        value = str(value)
      out[f.name] = value
    return out

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> 'End':
    """The inverse of :meth:`as_dict` (unknown keys ignored).

    Raises:
      ValueError: no ``status``/``step``, or an unknown status.
    """
    if not isinstance(d, Mapping) or 'status' not in d or 'step' not in d:
      raise ValueError(f'end: expected {{"status", "step", ...}}, got {d!r:.100}')
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in d.items() if k in names}
    if isinstance(values.get('best'), str):
      values['best'] = float(values['best'])
    return cls(**values)

  def words(self) -> str:
    """The end in one line: ``'early_stopped at step 150: eval/loss ...'``,
    ``'stopped by SIGTERM at step 80; ...'``."""
    if self.status == 'stopped' and self.signal:
      return f'stopped by {self.signal} at step {self.step}' + (
          f'; {self.reason}' if self.reason else '')
    return f'{self.status} at step {self.step}' + (f': {self.reason}' if self.reason else '')


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """The read-only record of one call, handed to each due hook.

  Attributes:
    first: ``state.step`` before the call (int).
    step: ``state.step`` after it: the true step, whatever ``steps_per_call``.
    state: the state after the call (a :class:`purax.TrainState`, or the
      stepped :class:`purax.core.population.Population`); on the device.
    metrics: the numbers written at this step so far, read-only: at a log
      point the loop's ``train/*`` window (floats, or ``[members]`` arrays
      for a population), ``train/learning_rate``, ``steps_per_sec``,
      ``compile_s``; then what earlier hooks of this step wrote (``eval/*``
      from :class:`purax.hooks.Evaluate`, ...).
    start: ``state.step`` when ``fit`` began.
    num_steps: the step the run trains to (None: until the data ends).
    end: how the run ended (:class:`End`), on the one final call; None while
      it trains.
    forced: this hook runs because the run ended, not by its cadence (a
      hook may then do nothing: :class:`purax.hooks.EMA` samples only on its
      cadence).
    plan: the run's plan (:mod:`purax.plan`): ``plan.evaluate(state, data)``.
    window: at a log point, the metrics window it was computed from
      (host arrays: sums and counts of the steps since the previous log
      point, :mod:`purax.core.metrics`); None elsewhere.
    histograms: ``{tag: array}`` given by earlier hooks of this step
      (:class:`purax.hooks.Histograms`), for the writers.
  """

  first: int
  step: int
  state: Any
  metrics: Mapping[str, Any]
  start: int = 0
  num_steps: int | None = None
  end: End | None = None
  forced: bool = False
  plan: Any = None
  window: Any = None
  histograms: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  _run: Any = dataclasses.field(default=None, repr=False, compare=False)

  def __post_init__(self):
    if not isinstance(self.metrics, types.MappingProxyType):
      object.__setattr__(self, 'metrics', types.MappingProxyType(dict(self.metrics)))

  @property
  def evaluated(self) -> bool:
    """Whether this step was evaluated (an ``eval/*`` number is in :attr:`metrics`)."""
    return any(k.startswith('eval/') for k in self.metrics)

  def checkpoint(self) -> tuple[dict, dict]:
    """``(tree, extra)``: everything a resume needs at this step
    (:func:`purax.io.checkpoint.run.checkpoint_tree` and
    :func:`purax.io.checkpoint.run.checkpoint_extra`: the state, the metrics
    window, the hooks' arrays and state, the data position, the end), for
    :class:`purax.hooks.Checkpoint`.

    Raises:
      ValueError: a record made outside ``fit``.
    """
    if self._run is None:
      raise ValueError('StepInfo.checkpoint: expected a record made by purax.fit, got one '
                       'made by hand')
    return self._run.checkpoint(self)

  def batch(self, step: int):
    """The host batch of ``step`` when the data can give it back (a random-access
    source; an iterable's batches only when a hook asked to keep them,
    ``keep_batches``), else None."""
    return None if self._run is None else self._run.source.batch(step)


@dataclasses.dataclass(frozen=True)
class Output:
  """What a hook gives back (or None: nothing).

  Attributes:
    state: the state to go on with (None: unchanged). PBT and per-member early
      stopping change it.
    metrics: numbers to write at this step (``{name: float or [members] array}``).
    stop: end the run after this step (:class:`End`; ``'early_stopped'`` for a
      hook's own decision, ``'stopped'`` for a signal). It is checkpointed.
    histograms: ``{tag: array}`` for the writers' ``write_histograms``.
  """

  state: Any = None
  metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  stop: End | None = None
  histograms: Mapping[str, Any] | None = None

