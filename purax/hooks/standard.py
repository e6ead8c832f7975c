"""The loop's usual hooks from the familiar options (:func:`standard`)."""

from __future__ import annotations

import math
import reprlib
from typing import Any, Callable, Iterable

import numpy as np

from purax.core.errors import ConfigError, expect, expect_kind
from purax.hooks.builtin import Checkpoint, Evaluate, Log, NonFiniteStreak, Profile, Progress, Stop
from purax.hooks.nonfinite import NonFiniteReplay
from purax.io import writers


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

