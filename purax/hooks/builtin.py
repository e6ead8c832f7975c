"""The loop's own hooks: logging, evaluation, the non-finite streak, the stop
flag, checkpoints, the progress bar and the profiler; :func:`standard` builds
them from the familiar options."""

from __future__ import annotations

import math
import reprlib
import time
from typing import Any, Callable, Iterable

import jax
import numpy as np

from purax.core import hparams as hparams_lib
from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, NonFiniteError, expect, expect_kind
from purax.core.population import Population
from purax.hooks.loop import due
from purax.io import compile_time
from purax.hooks.nonfinite import NonFiniteReplay
from purax.io import profile as profile_lib
from purax.io import progress as progress_lib
from purax.io import writers
from purax.io.checkpoint.run import checkpoint_extra, checkpoint_tree


def _train_state(state):
  """The :class:`TrainState` of ``state`` (a Population's stacked one)."""
  return state.state if isinstance(state, Population) else state


def _applied_packed(task, state):
  """The hyperparameters the last update applied: float32 ones packed into one
  :class:`purax.core.metrics.Window` (one host transfer at a log point instead
  of one per hyperparameter; float32 round-trips exactly), any other dtype as
  the tree itself."""
  values = hparams_lib.get(state, task.tx, applied=True)
  exact = all(getattr(x, 'dtype', None) == jax.numpy.float32 for x in jax.tree.leaves(values))
  return metrics_lib.window(values) if exact else values


# On the device (one small program per task, compiled at the start of a fit;
# read at log points).
_applied = jax.jit(_applied_packed, static_argnums=0)


class Log:
  """Fetches and writes the training metrics every ``every`` steps and at the
  end. The loop's one host sync.

  Each log point writes:

  - ``train/*``: the metrics of the steps since the last log point;
  - ``train/learning_rate``: the rate the last update applied (from the
    state's ``opt_state``: :func:`purax.core.hparams.get` with
    ``applied=True``), when the optimizer says it (:func:`purax.adamw`, or a
    ``learning_rate`` injected with ``optax.inject_hyperparams``);
    ``train/NAME`` for every other hyperparameter of the state once it has
    changed during the fit (an injected schedule, PBT, a hook that sets it);
  - ``steps_per_sec``: training throughput since the last log point, with
    the hooks' time and the compilation of the training programs
    (:mod:`purax.io.compile_time`) left out; the steps still queued on the
    device at the log point count until they finish (this hook's wait for
    the metrics; a hook that waits for the device before it, one of a lower
    ``order`` or one due at another step, books that wait as its own time);
  - ``compile_s``: those compilation seconds, at the log points whose window
    compiled (the first; another when ``steps_per_call='auto'`` builds its
    ``k``-step program).

  Attributes:
    every: steps between log points (>= 1).
    writer: a :class:`purax.io.writers.MetricWriter` (or None: only ``fit``'s
      history); flushed at the end.
  """

  order, at_end, name, option = -20, True, 'log', 'log_every'

  def __init__(self, every: int = 50, writer=None):
    expect(isinstance(every, int) and every >= 1, 'log_every', '>= 1', every, ConfigError)
    if writer is not None:
      expect(callable(getattr(writer, 'write_scalars', None)), 'writer',
             'a MetricWriter (with write_scalars(step, scalars))', type(writer).__name__,
             ConfigError)
    self.every, self.writer = every, writer
    self.varying: set[str] = set()

  def _clock(self, step: int) -> tuple:
    loop = self.loop
    return (time.perf_counter(), step, loop.hook_seconds(), compile_time.seconds(),
            loop.hook_compile_seconds())

  def start(self, loop) -> None:
    self.loop, self.logged = loop, None
    if self.writer is not None:
      loop.writers.append(self.writer)
    state = _train_state(loop.state)
    # On the device, read with the first log point: no host sync here.
    self.initial = _applied(loop.task, state) if hasattr(state, 'opt_state') else None
    self.clock = self._clock(loop.step)

  def __call__(self, step, state, record):
    loop = self.loop
    # The hyperparameters' program is queued behind the steps, and one
    # device_get waits once for the window, them and (at the first log point
    # only) the initial values: kept on the host from then on.
    hook_time = lambda: loop.hook_seconds() - loop.hook_compile_seconds()  # noqa: E731
    before = hook_time()
    applied = None if self.initial is None else _applied(loop.task, _train_state(state))
    window, applied, initial = jax.device_get((loop.metrics, applied, self.initial))
    # The wait for the window is the device finishing the steps queued before
    # this log point: step time, though it passes inside a hook (the hook time
    # it added, compilation aside; none when the hook runs untimed, at the end).
    waited = hook_time() - before
    self.initial = metrics_lib.as_tree(initial)     # on the host, unpacked once
    scalars = {f'train/{k}': v for k, v in metrics_lib.compute(window).items()}
    now, _, hook_s, compiled, hook_compiled = self._clock(step)
    compile_s = (compiled - self.clock[3]) - (hook_compiled - self.clock[4])
    seconds = (now - self.clock[0]) - (hook_s - self.clock[2] - waited) - compile_s
    scalars.update(self._hyperparams(applied))
    scalars['steps_per_sec'] = (step - self.clock[1]) / max(seconds, 1e-9)
    if compile_s > 0:
      scalars['compile_s'] = compile_s
    self.clock, self.logged = self._clock(step), step
    loop.metrics = metrics_lib.zeros_like(loop.metrics)
    return state, scalars

  def _hyperparams(self, applied) -> dict:
    """``train/learning_rate`` and the hyperparameters that have changed (host
    numbers), from ``applied`` (the host copy of :func:`_applied`; None without
    an ``opt_state``)."""
    if applied is None:
      return {}
    values = metrics_lib.as_tree(applied)
    self.varying |= {k for k, v in values.items()
                     if k in self.initial and not np.array_equal(v, self.initial[k])}
    return {f'train/{k}': v if np.ndim(v) else float(v) for k, v in sorted(values.items())
            if k == 'learning_rate' or k in self.varying}

  def state_dict(self) -> dict:
    return {'varying': sorted(self.varying)}

  def load_state_dict(self, d: dict) -> None:
    self.varying = set(d.get('varying', ()))

  def end(self, loop) -> None:
    if loop.at_end and not loop.failed and self.logged != loop.step and loop.step > loop.start:
      loop.run_hook(self)
    if self.writer is not None:
      self.writer.flush()


class Evaluate:
  """Evaluates on ``data`` every ``every`` steps and at the end: ``eval/*``
  (the plan's evaluation: padded batches count their ``weight``).

  Attributes:
    data: evaluation batches, iterated afresh each time (a list, a grain
      dataset; a one-shot iterable only with ``every=0``: one evaluation).
    every: steps between evaluations (0: only at the end).
  """

  order, at_end, name, option = -10, True, 'evaluate', 'eval_every'

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

  def start(self, loop) -> None:
    self.loop, self.evaluated = loop, None

  def __call__(self, step, state, record):
    self.evaluated = step
    return state, {f'eval/{k}': v for k, v in
                   metrics_lib.compute(self.loop.plan.evaluate(state, self.data)).items()}

  def end(self, loop) -> None:
    if loop.at_end and not loop.failed and self.evaluated != loop.step and loop.step > loop.start:
      loop.run_hook(self)


class NonFiniteStreak:
  """Stops with :class:`purax.core.errors.NonFiniteError` when ``limit`` consecutive steps had
  non-finite gradients (skipped updates), seen at the log points
  (``train/skip_streak``), naming the step window.

  Attributes:
    limit: the streak that stops the run (>= 1).
    every: the log cadence (it reads the log's record).
  """

  order, at_end, name, option = -15, True, 'non_finite_streak', 'log_every'

  def __init__(self, limit: int = 10, every: int = 50):
    expect(isinstance(limit, int) and limit >= 1, 'max_consecutive_skips', 'None or >= 1',
           limit, ConfigError)
    self.limit, self.every, self.since = limit, every, None

  def start(self, loop) -> None:
    self.since = loop.step

  def __call__(self, step, state, record):
    streak = float(np.max(record.get('train/skip_streak', 0)))
    since, self.since = self.since, step
    if streak >= self.limit:
      raise NonFiniteError(
          f'train/skip_streak: expected fewer than {self.limit} consecutive steps with '
          f'non-finite gradients, got {int(streak)} ending in steps ({since}, {step}]; the '
          'state is that of the last finite update (try a lower learning rate, clipping, '
          'or --debug-nans to find the source)')
    return state, {}


class Stop:
  """Polls ``poll()`` (a cheap host flag, e.g. :class:`purax.StopOnSignal`) after
  every call, or every ``every`` steps; when true the run checkpoints and ends.

  Attributes:
    poll: ``() -> bool``.
    every: None (every call) or steps between polls (a multi-host run polls
      at the same steps on every process: an agreement is a collective).
  """

  order, at_end, name, option = 10, False, 'stop', 'stop_every'

  def __init__(self, poll: Callable[[], bool], every: int | None = None):
    expect(callable(poll), 'should_stop', 'a callable () -> bool', type(poll).__name__,
           ConfigError)
    self.poll, self.every = poll, every

  def __call__(self, step, state, record):
    return state, ({'stop': True} if self.poll() else {})


class Checkpoint:
  """Saves the run (:func:`purax.io.checkpoint.run.checkpoint_tree`: the state, the
  metrics window, the hooks' arrays; the data position and the hooks' state in
  the JSON) every ``every`` steps, at log and evaluation points where the
  checkpointer's wall-clock cadence says so (:meth:`Checkpointer.should_save`),
  at the last step, and when the run stops; asynchronously, with every
  number written at the step (``eval/*``, and ``train/*`` at a log point: what
  keep-best ranks by, :class:`purax.io.checkpoint.Checkpointer`'s
  ``best_metric``). At the end it waits for the commit.

  Attributes:
    checkpointer: a :class:`purax.Checkpointer`.
    every: steps between saves (0: none besides the clock, the stop and the end).
    log_every: the steps where the clock is read: the log and evaluation
      cadences' gcd (0: at evaluations only).
  """

  order, at_end, name, option = 20, True, 'checkpoint', 'checkpoint_every'

  def __init__(self, checkpointer, every: int = 0, log_every: int = 0):
    expect(callable(getattr(checkpointer, 'save', None)), 'checkpointer', 'a Checkpointer',
           type(checkpointer).__name__, ConfigError)
    expect(isinstance(every, int) and every >= 0, 'checkpoint_every', '>= 0', every,
           ConfigError)
    self.checkpointer, self.steps = checkpointer, every
    self.every = np.gcd(every, log_every).item() if every or log_every else 0

  def start(self, loop) -> None:
    self.loop, self.saved = loop, None

  def save(self, loop) -> None:
    # Every number written at this step (eval/*, train/* at a log point, ...):
    # keep-best ranks by any of them (a population's [members] values: none).
    numbers = {k: float(v) for k, v in loop.record.items()
               if np.ndim(v) == 0 and isinstance(v, (int, float, np.number))
               and not isinstance(v, bool)}
    self.checkpointer.save(
        loop.step, checkpoint_tree(loop.state, loop.metrics, loop.hook_arrays()),
        metrics=numbers or None,
        extra=checkpoint_extra(loop.position, loop.hook_states()))
    self.saved = loop.step

  def __call__(self, step, state, record):
    loop = self.loop
    if (loop.at_end or (self.steps and due(self.steps, loop.first, step))
        or (record and self.checkpointer.should_save(step))):
      self.save(loop)
    return state, {}

  def end(self, loop) -> None:
    if loop.failed:
      return
    if self.saved != loop.step and loop.step > loop.start and (loop.stop or loop.at_end):
      self.save(loop)
    self.checkpointer.wait()


class Progress:
  """A progress bar (steps/s, loss, ETA) where someone watches it
  (:func:`purax.io.progress.bar`: a terminal or a notebook)."""

  order, every, at_end, name = 30, None, True, 'progress'

  def __init__(self, enabled: bool = True):
    self.enabled = enabled

  def start(self, loop) -> None:
    self.bar = progress_lib.bar(loop.num_steps, loop.step, enabled=self.enabled)
    self.shown = loop.step

  def __call__(self, step, state, record):
    self.bar.update(step - self.shown)
    self.shown = step
    loss = record.get('train/loss')
    if loss is not None and np.ndim(loss) == 0:
      self.bar.set_postfix(loss=f'{loss:.4f}', refresh=False)
    return state, {}

  def end(self, loop) -> None:
    self.bar.close()


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

  order, every, at_end, name = 100, None, True, 'profile'

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

  def start(self, loop) -> None:
    self._enter(loop.step)

  def __call__(self, step, state, record):
    self._exit()
    if self.profiler.active and step >= self.profiler.stop:
      self.profiler.end(state)
    else:
      self._enter(step)
    return state, {}

  def end(self, loop) -> None:
    self._exit()
    self.profiler.close(None if loop.failed else loop.state)


def standard(*, log_every: int = 50, writer=None, eval_data: Iterable | None = None,
             eval_every: int = 0, checkpointer=None, checkpoint_every: int = 0,
             should_stop: Callable[[], bool] | None = None, stop_every: int | None = None,
             max_consecutive_skips: int | None = 10, progress: bool = True,
             profile: tuple[int, int] | None = None, profile_dir: str | None = None,
             profile_memory: bool = False, replay_dir: str | None = None,
             debug_nans: bool = False) -> list:
  """The loop's usual hooks from the familiar options:
  ``fit(task, state, data, hooks=purax.hooks.standard(eval_data=test, log_every=10))``.

  Args:
    log_every: :class:`Log` cadence (>= 1).
    writer: :class:`Log`'s writer. None: a
      :class:`purax.io.writers.ConsoleWriter`, one plain line per log point
      as a record of the ``purax`` logger (printed on stdout where
      ``logging`` is not configured; silence it with
      ``logging.getLogger('purax').setLevel(logging.WARNING)``, route it with
      a handler). To keep the line next to files:
      ``writers.MultiWriter([writers.create_default_writer(workdir), ...])``
      (which holds a ConsoleWriter); ``writers.MultiWriter([])``: nothing.
    eval_data, eval_every: :class:`Evaluate` (when ``eval_data`` is given;
      ``eval_every=0``: only at the end).
    checkpointer, checkpoint_every: :class:`Checkpoint` (when a checkpointer is given).
    should_stop, stop_every: :class:`Stop` (when ``should_stop`` is given).
    max_consecutive_skips: :class:`NonFiniteStreak` (None: off).
    progress: :class:`Progress` (False: no such hook).
    profile: ``(start, stop)`` of :class:`Profile`, written to ``profile_dir``.
    profile_memory: the profile also writes a device memory profile.
    replay_dir: where :class:`purax.hooks.NonFiniteReplay` (always one of the
      hooks: it costs nothing while every update is finite) saves a skipped
      update it replays (None: reported, not saved).
    debug_nans: replay every skipped update at its step (one host read per
      step) rather than the streaks that end a log window.

  Returns:
    A list of hooks (``fit`` runs them in their ``order``).

  Raises:
    ConfigError: an option out of range (named).
  """
  for name, value in (('progress', progress), ('profile_memory', profile_memory),
                      ('debug_nans', debug_nans)):
    expect_kind(value, name, (bool, np.bool_), 'a bool')
  if profile is not None:
    expect(isinstance(profile, (tuple, list)) and len(profile) == 2
           and all(isinstance(s, int) for s in profile), 'profile',
           '(start, stop): two steps', reprlib.repr(profile), ConfigError)
    expect_kind(profile_dir, 'profile_dir', str, 'a directory for the trace')
  # No bar asked for: no hook that would run after every call to draw nothing.
  writer = writers.ConsoleWriter() if writer is None else writer
  hooks: list[Any] = [Log(log_every, writer)] + ([Progress()] if progress else [])
  if eval_data is not None:
    hooks.append(Evaluate(eval_data, eval_every))
  else:
    expect(isinstance(eval_every, int) and eval_every >= 0, 'eval_every', '>= 0', eval_every,
           ConfigError)
  hooks.append(NonFiniteReplay(log_every, directory=replay_dir, every_step=debug_nans))
  if max_consecutive_skips is not None:
    hooks.append(NonFiniteStreak(max_consecutive_skips, log_every))
  if should_stop is not None:
    hooks.append(Stop(should_stop, stop_every))
  if checkpointer is not None:
    points = math.gcd(log_every, eval_every) if eval_data is not None else log_every
    hooks.append(Checkpoint(checkpointer, checkpoint_every, points))   # the clock: log/eval
  else:
    expect(isinstance(checkpoint_every, int) and checkpoint_every >= 0, 'checkpoint_every',
           '>= 0', checkpoint_every, ConfigError)
  if profile is not None:
    expect(profile_dir is not None, 'profile_dir', 'a directory for the trace', None,
           ConfigError)
    hooks.append(Profile(profile_dir, *profile, memory_profile=profile_memory))
  return hooks

