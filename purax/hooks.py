"""Hooks: what ``fit`` runs at its log and evaluation points (the CLU
periodic-action idea), on their own cadence.

A hook is any object with

- ``every``: run after the log/eval point of every step ``s`` with
  ``s % every == 0``; ``0``: after every evaluation;
- ``at_end``: whether to run at the last step too;
- ``__call__(step, state, record) -> (state, info)``: ``record`` holds the
  numbers written at this step (``train/*``, ``eval/*``, each a float or, for
  a population, a ``[members]`` array); the hook returns the state (changed
  or not) and a dict of numbers to write (``{'stop': True}`` ends training
  after this step, checkpointed);
- optionally ``state_dict() -> JSON`` and ``load_state_dict(d)``: what a later
  decision depends on (best score, patience counter); ``fit`` saves it in
  every checkpoint (``extra['hooks'][name]``) and restores it from
  ``hook_state=`` (``restore_or_init(...).extra.get('hooks')``).

Provided: :class:`EarlyStopping` (one run), :class:`PopulationEarlyStopping`
and :class:`PBT` (populations).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from purax.core import pbt
from purax.core import population as pop_lib
from purax.core.errors import ConfigError, expect


def scores(record: dict, metric: str, mode: str) -> np.ndarray:
  """float32 scores to minimise from ``record['eval/' + metric]`` (non-finite: +inf).

  Raises:
    ConfigError: the metric was not evaluated at this step.
  """
  name = f'eval/{metric}'
  expect(name in record, 'metric', f'one of {sorted(k[5:] for k in record if k.startswith("eval/"))}'
         ' (evaluated at this step)', repr(metric), ConfigError)
  value = np.asarray(record[name], np.float32)
  value = -value if mode == 'max' else value
  return np.where(np.isfinite(value), value, np.inf).astype(np.float32)


@dataclasses.dataclass
class EarlyStopping:
  """Stops a run after ``patience`` evaluations without an improvement of more
  than ``min_delta`` in ``metric``; its best score and counter are checkpointed.

  Attributes:
    metric: an eval metric name (``'loss'``, ``'accuracy'``, ...).
    mode: ``'min'`` or ``'max'``.
    patience: evaluations without improvement before stopping (>= 1).
    min_delta: the improvement that counts.
  """

  metric: str = 'loss'
  mode: Literal['min', 'max'] = 'min'
  patience: int = 3
  min_delta: float = 0.0
  every: int = 0
  at_end: bool = False
  best: float = math.inf
  stale: int = 0
  name: str = 'early_stopping'

  def __post_init__(self):
    expect(self.patience >= 1, 'patience', '>= 1', self.patience, ConfigError)
    expect(self.mode in ('min', 'max'), 'mode', "'min' or 'max'", repr(self.mode), ConfigError)

  def __call__(self, step, state, record):
    score = float(scores(record, self.metric, self.mode))
    if score < self.best - self.min_delta:
      self.best, self.stale = score, 0
    else:
      self.stale += 1
    stop = self.stale >= self.patience
    return state, {'early_stopping/stale': self.stale, **({'stop': True} if stop else {})}

  def state_dict(self) -> dict:
    return {'best': self.best if math.isfinite(self.best) else None, 'stale': self.stale}

  def load_state_dict(self, d: dict) -> None:
    self.best = math.inf if d.get('best') is None else float(d['best'])
    self.stale = int(d['stale'])


_early_stopping = jax.jit(pop_lib.early_stopping, static_argnames=('patience', 'min_delta'))


@dataclasses.dataclass
class PopulationEarlyStopping:
  """Per-member early stopping (:func:`purax.core.population.early_stopping`) at
  every evaluation; its state (best, stale, stopped) lives in the Population."""

  metric: str = 'loss'
  mode: Literal['min', 'max'] = 'min'
  patience: int = 3
  every: int = 0
  at_end: bool = True
  name: str = 'population_early_stopping'

  def __call__(self, step, pop, record):
    return _early_stopping(pop, jnp.asarray(scores(record, self.metric, self.mode)),
                           patience=self.patience), {}


@dataclasses.dataclass
class PBT:
  """Population-based training (Jaderberg et al. 2017): every ``every`` steps,
  after an evaluation at that step, the worst ``fraction`` of members copy the
  best members' state and perturb their hyperparameters
  (:func:`purax.core.pbt.exploit_explore`, keyed by ``fold_in(key, step)``).

  ``every`` must be a multiple of ``fit``'s ``eval_every`` (PBT ranks members
  by their evaluation at that step): :meth:`check` says so. ``names`` and
  ``bounds``: the hyperparameters perturbed and their clip intervals (as
  :func:`purax.core.pbt.exploit_explore`).
  """

  every: int
  metric: str = 'loss'
  mode: Literal['min', 'max'] = 'min'
  fraction: float = 0.25
  key: Any = None
  names: tuple[str, ...] | None = None
  bounds: Any = None
  at_end: bool = False
  name: str = 'pbt'

  def check(self, eval_every: int) -> None:
    """Raises ConfigError unless PBT's cadence falls on evaluations."""
    expect(self.every >= 1, 'pbt_every', '>= 1', self.every, ConfigError)
    expect(eval_every >= 1 and self.every % eval_every == 0, 'pbt_every',
           f'a multiple of eval_every={eval_every} (PBT ranks members by the evaluation '
           'at its step)', self.every, ConfigError)

  def __call__(self, step, pop, record):
    key = jax.random.key(0) if self.key is None else self.key
    pop, info = pbt.exploit_explore(pop, jnp.asarray(scores(record, self.metric, self.mode)),
                                    key=jax.random.fold_in(key, step), fraction=self.fraction,
                                    names=self.names, bounds=self.bounds)
    return pop, {'pbt/source': np.asarray(info['source'])}
