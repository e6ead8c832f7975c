"""Replaying a skipped non-finite update to say where its NaN came from.

How the loop learns which update was skipped, without a host read per step:
the step already counts skipped updates (``metrics['skipped']``) and the
streak of them at the end of the window (``metrics['skip_streak']``), summed
on the device and read at the log points, where :class:`purax.hooks.Log`
syncs anyway. A skipped update leaves params, optimizer state and model state
as they were, so when the window ends in a streak of ``n`` skipped updates
the state at the log point *is* the state before each of them (its ``step``
set back, its loss scale, if any, doubled back): the first of the streak,
update ``step - n``, is replayed exactly. Its batch is ``data[step - n]``,
read again from a random-access source (what ``purax train`` and a list of
batches are); an iterable's batches are kept only when asked (``keep``: a
host copy each, the copy the step gets). So when nothing is non-finite the
hook reads one number of the log record at each log point and nothing else.

Skipped updates followed by finite ones in the same window are named (how
many, in which steps) but cannot be replayed: their state is gone. With
``every_step=True`` (``purax train --debug-nans``) every update runs in a
call of its own and the hook reads the streak after each (one host read per
step), so each skipped update is replayed at its step.

Not replayed: a population's members (:class:`purax.core.population.Population`)
and the state of a run on several processes.
"""

from __future__ import annotations

import os
import warnings

import jax
import jax.numpy as jnp

from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, NonFiniteWarning, expect
from purax.core.state import TrainState
from purax.inspect import nan as nonfinite
from purax.io.checkpoint import replay

#: ``alone`` of a hook that replays at every step: every update in a call of its own.
EVERY_UPDATE = range(0, 2 ** 31 - 1)


class NonFiniteReplay:
  """When an update was skipped as non-finite, replays it on its batch
  (:func:`purax.inspect.nan.find`) and reports where the first non-finite
  value came from: a one-line ``purax:`` :class:`purax.core.errors.NonFiniteWarning`
  (updates that cannot be replayed are named once per ``fit``), ``reports``, and (with
  a ``directory``) the state before the update, its batch and the report,
  saved for ``purax debug-nan`` (:mod:`purax.io.checkpoint.replay`).

  Attributes:
    every: the log cadence (it reads the log's ``train/skipped``); None with
      ``every_step``.
    directory: where updates are saved (a run's ``WORKDIR/nonfinite``), or None.
    every_step: replay each skipped update at its step (one host read per
      step; every update in a call of its own).
    keep: batches of an iterable source to keep for a replay (0: none; a
      random-access source needs none).
    max_reports: replays in one ``fit`` at most (each saved one is kept).
    reports: the :class:`purax.inspect.nan.Report` of each replay.
  """

  order, name, option = -16, 'non_finite_replay', 'log_every'

  def __init__(self, every: int = 50, *, directory: str | None = None,
               every_step: bool = False, keep: int = 0, max_reports: int = 3):
    expect(isinstance(every, int) and every >= 1, 'log_every', '>= 1', every, ConfigError)
    expect(isinstance(max_reports, int) and max_reports >= 1, 'max_reports', '>= 1',
           max_reports, ConfigError)
    expect(isinstance(keep, int) and keep >= 0, 'keep', '>= 0', keep, ConfigError)
    self.every = None if every_step else every
    self.every_step, self.directory, self.keep = every_step, directory, keep
    self.max_reports = max_reports
    self.alone = EVERY_UPDATE if every_step else None
    self.reports: list[nonfinite.Report] = []
    self.since = self.replayed = None
    self.noted = False

  @property
  def keep_batches(self) -> int:
    """Batches of an iterable source the loop keeps for a replay (``keep``)."""
    return self.keep

  def __call__(self, info):
    if self.since is None:
      self.since, self.replayed, self.noted = info.start, None, False
    if info.first == info.step or (info.end is not None and info.end.status == 'failed'):
      return None
    step, state, record = info.step, info.state, info.metrics
    since, self.since = self.since, step
    if (not isinstance(state, TrainState) or len(self.reports) >= self.max_reports
        or jax.process_count() > 1):          # a population, or a multi-host state: not replayed
      return None
    if not self.every_step and not record.get('train/skipped'):
      return None                             # the log's number: nothing to read
    if self.every_step and info.window is None:
      window = metrics_lib.as_tree(info._run.window)   # every step: the device window
      streak = int(jax.device_get(window['skip_streak'].current)) \
          if 'skip_streak' in window else 0
    else:
      window = metrics_lib.as_tree(info.window) if info.window is not None else {}
      streak = int(window['skip_streak'].current) if 'skip_streak' in window else 0
    if not streak:
      if not self.every_step and not self.noted:    # once per fit
        self.noted = True
        warnings.warn(f'purax: {int(record["train/skipped"])} update(s) in steps ({since}, '
                      f'{step}] were skipped as non-finite and training went on; their state '
                      'is gone, so they cannot be replayed (purax train --debug-nans, or '
                      'purax.hooks.NonFiniteReplay(every_step=True), replays each at its step)',
                      NonFiniteWarning, stacklevel=2)
      return None
    first = step - streak                     # the streak's first update: replayed
    if first == self.replayed:
      return None
    self.replayed = first
    batch = info.batch(first)
    if batch is None:
      warnings.warn(f'purax: the update at state.step={first} was skipped as non-finite; its '
                    'batch was not kept (an iterable source: NonFiniteReplay(keep=N) keeps '
                    'the last N), so it is not replayed', NonFiniteWarning, stacklevel=2)
      return None
    before = before_skips(state, first, streak)
    with jax.transfer_guard('allow'):         # a replay, off the hot path
      report = nonfinite.find(info.plan.task, before, batch)
      self.reports.append(report)
      saved = ''
      if self.directory is not None:
        replay.save_update(self.directory, before, batch, report.as_dict(),
                           keep=self.max_reports)
        run = os.path.dirname(os.path.abspath(self.directory))
        saved = (f'; replay it: purax debug-nan --workdir {run} --step {first}'
                 if os.path.isfile(os.path.join(run, 'config.json')) else
                 f'; saved in {self.directory}')
    warnings.warn(f'purax: non-finite {report}{saved}', NonFiniteWarning, stacklevel=2)
    return None


def before_skips(state: TrainState, step: int, skipped: int) -> TrainState:
  """The state before the update at ``step``, from the state after it and
  ``skipped - 1`` more skipped updates: the same params, optimizer and model
  state; ``step`` set back; a loss scale doubled back once per skipped update
  (capped at its maximum; its count of good steps, which no gradient reads, is 0)."""
  state = state.replace(step=jnp.asarray(step, jnp.int32))
  scale = state.guards.get('loss_scale')
  if scale is not None:
    state = state.replace(guards={**state.guards, 'loss_scale': scale.replace(
        scale=jnp.minimum(scale.scale * 2.0 ** skipped, scale.max_scale).astype(jnp.float32))})
  return state
