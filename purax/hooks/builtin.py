"""The loop's own hooks: logging, evaluation, the non-finite streak, the stop
flag, checkpoints, the progress bar and the profiler
(:func:`purax.hooks.standard` builds them from the familiar options)."""

from __future__ import annotations

from typing import Callable, Iterable

import jax
import numpy as np

from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, NonFiniteError, expect
from purax.hooks.runner import due
from purax.hooks.record import End, Output
from purax.io import profile as profile_lib
from purax.io import progress as progress_lib


class Log:
  """Writes what each step wrote to ``writer``, and sets the log points.

  Every ``every`` steps (and at the end of a finished or early-stopped run)
  the loop reads its metrics window (the loop's one host sync) into
  the step's record: ``train/*`` (the metrics of the steps since the last log
  point), ``train/learning_rate`` (the rate the last update applied, when the
  optimizer says it: :func:`purax.adamw`, or a ``learning_rate`` injected
  with ``optax.inject_hyperparams``), ``train/NAME`` for every other
  hyperparameter once it has changed during the run, ``steps_per_sec``
  (throughput with the hooks' time and the training programs' compilation
  left out) and ``compile_s`` (when the window compiled). This hook writes
  every record to ``writer`` after the hooks before it (``order`` 15: after
  evaluation and early stopping, before the checkpoint, so a killed run loses
  no record of a committed step), the end of the run (``write_end``, where the
  writer has it) at the end, and flushes.

  Attributes:
    log_every: steps between log points (>= 1); ``every`` is None (it runs
      after every call, writing only when something was written).
    writer: a :class:`purax.io.writers.MetricWriter` (or None: only ``fit``'s
      history).
  """

  order, every, name, option = 15, None, 'log_writer', 'log_every'

  def __init__(self, every: int = 50, writer=None):
    expect(isinstance(every, int) and not isinstance(every, bool) and every >= 1, 'log_every',
           '>= 1', every, ConfigError)
    if writer is not None:
      expect(callable(getattr(writer, 'write_scalars', None)), 'writer',
             'a MetricWriter (with write_scalars(step, scalars))', type(writer).__name__,
             ConfigError)
    self.log_every, self.writer = every, writer
    self.written: tuple[int, set] = (-1, set())

  def __call__(self, info):
    if self.writer is None or jax.process_index() != 0:
      return None
    step, keys = self.written
    if step != info.step:
      keys = set()
    new = {k: v for k, v in info.metrics.items() if k not in keys}
    if new:
      self.writer.write_scalars(info.step, new)
    if info.histograms and hasattr(self.writer, 'write_histograms'):
      self.writer.write_histograms(info.step, dict(info.histograms))
    self.written = (info.step, keys | set(new))
    if info.end is not None:
      if hasattr(self.writer, 'write_end'):
        self.writer.write_end(info.step, info.end.as_dict())
      self.writer.flush()
    return None


class Evaluate:
  """Evaluates on ``data`` every ``every`` steps and at the end of a finished
  or early-stopped run not evaluated at its last step: ``eval/*`` (the plan's
  evaluation: padded batches count their ``weight``).

  Attributes:
    data: evaluation batches, iterated afresh each time (a list, a grain
      dataset; a one-shot iterable only with ``every=0``: one evaluation).
    every: steps between evaluations (0: only at the end).
  """

  order, name, option = -10, 'evaluate', 'eval_every'

  def __init__(self, data: Iterable, every: int = 0):
    expect(isinstance(every, int) and every >= 0, 'eval_every', '>= 0', every, ConfigError)
    expect(not isinstance(data, dict), 'eval_data', 'evaluation batches (a list of batch '
           'dicts, a grain dataset), not one batch',
           f'a dict with keys {sorted(data)}' if isinstance(data, dict) else '', ConfigError)
    expect(hasattr(data, '__iter__') and not isinstance(data, (str, bytes)), 'eval_data',
           'evaluation batches (a list of batch dicts, a grain dataset)',
           f'{type(data).__name__} {data!r:.60}', ConfigError)
    expect(every == 0 or iter(data) is not data, 'eval_data', 'a collection iterated '
           'afresh at every evaluation (a list, a grain dataset)',
           f'a one-shot {type(data).__name__}', ConfigError)
    self.data, self.every = data, every

  def __call__(self, info):
    if info.forced and not (info.end.done and not info.evaluated and info.step > info.start):
      return None
    return Output(metrics={f'eval/{k}': v for k, v in
                           metrics_lib.compute(info.plan.evaluate(info.state, self.data)).items()})


class NonFiniteStreak:
  """Stops with :class:`purax.core.errors.NonFiniteError` when ``limit`` consecutive steps had
  non-finite gradients (skipped updates), seen at the log points
  (``train/skip_streak``), naming the step window.

  Attributes:
    limit: the streak that stops the run (>= 1).
    every: the log cadence (it reads the log point's record).
  """

  order, name, option = -15, 'non_finite_streak', 'log_every'

  def __init__(self, limit: int = 10, every: int = 50):
    expect(isinstance(limit, int) and limit >= 1, 'max_consecutive_skips', 'None or >= 1',
           limit, ConfigError)
    self.limit, self.every, self.since = limit, every, None

  def __call__(self, info):
    if 'train/skip_streak' not in info.metrics or (info.end is not None
                                                    and info.end.status == 'failed'):
      return None
    streak = float(np.max(info.metrics['train/skip_streak']))
    since = info.start if self.since is None else self.since
    self.since = info.step
    if streak >= self.limit:
      raise NonFiniteError(
          f'train/skip_streak: expected fewer than {self.limit} consecutive steps with '
          f'non-finite gradients, got {int(streak)} ending in steps ({since}, {info.step}]; '
          'the state is that of the last finite update (try a lower learning rate, '
          'clipping, or --debug-nans to find the source)')
    return None


class Stop:
  """Polls ``poll()`` (a cheap host flag, e.g. :class:`purax.StopOnSignal`) after
  every call, or every ``every`` steps; when true the run ends ``stopped``
  (resumable), checkpointed.

  Attributes:
    poll: ``() -> bool``.
    every: None (every call) or steps between polls (a multi-host run polls
      at the same steps on every process: an agreement is a collective).
  """

  order, name, option = 17, 'stop', 'stop_every'   # after Log: a signal while logging stops here

  def __init__(self, poll: Callable[[], bool], every: int | None = None):
    expect(callable(poll), 'should_stop', 'a callable () -> bool', type(poll).__name__,
           ConfigError)
    self.poll, self.every = poll, every

  def __call__(self, info):
    if info.end is not None or info.first == info.step or not self.poll():
      return None
    signal = getattr(self.poll, 'received', None)
    return Output(stop=End('stopped', info.step, 'resumable' if signal else
                           'by a stop request; resumable', signal=signal))


class Checkpoint:
  """Saves the run (:meth:`purax.hooks.StepInfo.checkpoint`: the state, the
  metrics window, the hooks' arrays; the data position, the hooks' state and
  the end in the JSON) every ``every`` steps, at log and evaluation points where
  the checkpointer's wall-clock cadence says so
  (:meth:`purax.Checkpointer.should_save`), at every step that writes the
  checkpointer's ``best_metric`` with a score among its best ``keep_best``
  (so the best evaluations are always kept, :meth:`Checkpointer.would_keep`),
  and at the end of a run that did not fail (finished, early-stopped or
  stopped); asynchronously, with every number written at the step. At the
  end it waits for the commit.

  Attributes:
    checkpointer: a :class:`purax.Checkpointer`.
    every: steps between saves (0: none besides the clock, the best, the stop
      and the end).
    log_every: the steps where the clock is read: the log and evaluation
      cadences' gcd (0: at evaluations only).
  """

  order, name, option = 20, 'checkpoint', 'checkpoint_every'

  def __init__(self, checkpointer, every: int = 0, log_every: int = 0):
    expect(callable(getattr(checkpointer, 'save', None)), 'checkpointer', 'a Checkpointer',
           type(checkpointer).__name__, ConfigError)
    expect(isinstance(every, int) and every >= 0, 'checkpoint_every', '>= 0', every,
           ConfigError)
    self.checkpointer, self.steps = checkpointer, every
    self.every = np.gcd(every, log_every).item() if every or log_every else 0
    self.saved = None
    self.rewinds = False    # a rollback went back in this fit: its end is saved, wherever

  def _best(self, info) -> bool:
    """The step writes the best metric with a score the checkpointer would keep."""
    would_keep = getattr(self.checkpointer, 'would_keep', None)
    return would_keep is not None and would_keep(info.metrics)

  def save(self, info) -> None:
    # Every number written at this step (eval/*, train/* at a log point, ...):
    # keep-best ranks by any of them (a population's [members] values: none).
    numbers = {k: float(v) for k, v in info.metrics.items()
               if np.ndim(v) == 0 and isinstance(v, (int, float, np.number))
               and not isinstance(v, bool)}
    tree, extra = info.checkpoint()
    self.checkpointer.save(info.step, tree, metrics=numbers or None, extra=extra)
    self.saved = info.step

  def rewound(self, step: int) -> None:
    """The run went back to ``step`` (a rollback): the checkpoints from it on are
    of the run before the rollback, deleted (their steps are saved again as it
    gets there; ``step``'s own too: its data position and events were the old
    ones, and a run that ends at ``step`` saves it again)."""
    if callable(getattr(self.checkpointer, 'drop_after', None)):
      self.checkpointer.drop_after(step - 1)
    if self.saved is not None and self.saved >= step:
      self.saved = None
    self.rewinds = True

  def __call__(self, info):
    if info.end is not None:
      if info.end.status != 'failed':
        if self.saved != info.step and (info.step > info.start or self.rewinds):
          self.save(info)
        self.checkpointer.wait()
      self.rewinds = False
      return None
    if info.first == info.step or self.saved == info.step:
      return None
    if ((self.steps and due(self.steps, info.first, info.step)) or self._best(info)
        or (info.metrics and self.checkpointer.should_save(info.step))):
      self.save(info)
    return None


class Progress:
  """A progress bar (steps/s, loss, ETA) where someone watches it
  (:func:`purax.io.progress.bar`: a terminal or a notebook)."""

  order, every, name = 30, None, 'progress'

  def __init__(self, enabled: bool = True):
    self.enabled, self.bar = enabled, None

  def __call__(self, info):
    if self.bar is None:
      self.bar = progress_lib.bar(info.num_steps, info.first, enabled=self.enabled)
      self.shown = info.first
    self.bar.update(info.step - self.shown)
    self.shown = info.step
    loss = info.metrics.get('train/loss')
    if loss is not None and np.ndim(loss) == 0:
      self.bar.set_postfix(loss=f'{loss:.4f}', refresh=False)
    if info.end is not None:
      self.bar.close()
      self.bar = None
    return None


class Profile:
  """A ``jax.profiler`` trace of the updates ``start <= state.step < stop``
  (:mod:`purax.io.profile`), each in a ``StepTraceAnnotation('train',
  step_num=s)`` that spans its call and the hooks after it. Those updates run
  one per call whatever ``steps_per_call`` (``alone``), so the
  annotations are exactly ``start, ..., stop - 1``.

  Attributes:
    logdir: where the trace goes (a run directory).
    start, stop: the range of ``state.step``.
    memory_profile: also write ``logdir/memory.prof`` when the trace stops.
  """

  order, every, name = 100, None, 'profile'

  def __init__(self, logdir: str, start: int, stop: int, *, memory_profile: bool = False):
    self.profiler = profile_lib.Profiler(logdir, start, stop, memory_profile=memory_profile)
    self.alone = range(start, stop)
    self.annotation = None

  def _enter(self, step) -> None:
    p = self.profiler
    if not p.done and p.start <= step < p.stop:
      if not p.active:
        p.begin()
      self.annotation = jax.profiler.StepTraceAnnotation(profile_lib.STEP_NAME, step_num=step)
      self.annotation.__enter__()

  def _exit(self) -> None:
    if self.annotation is not None:
      self.annotation.__exit__(None, None, None)
      self.annotation = None

  def __call__(self, info):
    self._exit()
    if info.end is not None:
      self.profiler.close(None if info.end.status == 'failed' else info.state)
    elif self.profiler.active and info.step >= self.profiler.stop:
      self.profiler.end(info.state)
    else:
      self._enter(info.step)
    return None
