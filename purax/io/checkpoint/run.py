"""A run's checkpoint layout: what ``fit`` saves and what a restore gives back.

A run's checkpoint is :func:`checkpoint_tree` (arrays: ``{'state':
TrainState, 'train_metrics': window, 'hooks': {name: arrays}}``) with
:func:`checkpoint_extra` in its JSON (``{'data': position, 'hooks': {name:
state_dict}}``); :class:`Restored` is what a restore found, and
:func:`checkpoint_directory` the checkpoint directory a path names.
:func:`purax.restore_or_init` (:mod:`purax.resume`, beside ``fit``: it needs
the run's plan) is the inverse, for research code as for ``purax train``;
``purax.io.checkpoint.run.restore_or_init`` is bound to it on first use (io
imports nothing of plan: ``docs/design.md``, the import table).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, expect
from purax.core.state import TrainState


def checkpoint_tree(state, train_metrics, hook_arrays: dict | None = None) -> dict:
  """The array tree of a run's checkpoint (``hooks`` only when a hook has arrays)."""
  tree = {'state': state, 'train_metrics': metrics_lib.as_tree(train_metrics)}
  if hook_arrays:
    tree['hooks'] = dict(hook_arrays)
  return tree


def checkpoint_extra(position: dict, hook_states: dict | None = None) -> dict:
  """The JSON a run's checkpoint adds: the data position and the hooks' state."""
  extra = {'data': dict(position)}
  if hook_states:
    extra['hooks'] = dict(hook_states)
  return extra


def abstract_checkpoint(task, batch, hooks=()) -> dict:
  """The abstract ``{'state', 'train_metrics'}`` tree that ``fit`` checkpoints,
  with ``'hooks': {name: ...}`` when a hook has array state (``init_arrays``)."""
  state = task.abstract_state(batch)
  acc = jax.eval_shape(lambda s, b: task.step(s, b)[1], state, batch)
  tree = {'state': state, 'train_metrics': acc}
  arrays = {getattr(h, 'name', type(h).__name__): jax.eval_shape(h.init_arrays, state)
            for h in hooks if callable(getattr(h, 'init_arrays', None))}
  if arrays:
    tree['hooks'] = arrays
  return tree


@dataclasses.dataclass
class Restored:
  """What :func:`purax.restore_or_init` found.

  Attributes:
    state: the restored (or fresh) :class:`TrainState`.
    train_metrics: the running metrics window to continue (``None`` when fresh).
    step: the checkpoint's step (0 when fresh).
    data_state: an iterable's saved position (``fit`` takes the whole :class:`Restored`), or None.
    extra: the checkpoint's JSON extra (``{}`` when fresh); ``extra['end']``:
      how the run had ended when it was saved
      (:meth:`purax.hooks.End.from_dict`), absent while it trained.
    hook_arrays: ``{name: tree}`` of the hooks with array state (``fit``'s
      ``hook_arrays``), or None (fresh, or no such hook given).
  """

  state: TrainState
  train_metrics: Any
  step: int
  data_state: Any
  extra: dict
  hook_arrays: Any = None

  @property
  def fresh(self) -> bool:
    return not self.extra

  @property
  def hook_states(self) -> dict | None:
    """``{name: state_dict}`` of the hooks, as saved (None when fresh)."""
    return self.extra.get('hooks')

  @classmethod
  def of(cls, tree: dict, extra: dict, step: int) -> 'Restored':
    """What checkpoint ``step`` (``tree`` and its JSON ``extra``) holds.

    Raises:
      ConfigError: the data position disagrees with the state's step.
    """
    data = extra.get('data', {})
    state_step = int(jax.device_get(tree['state'].step))
    expect(data.get('next_step', state_step) == state_step, 'checkpoint data position',
           f'next_step == state.step ({state_step}) in checkpoint {step}',
           data.get('next_step'), ConfigError)
    return cls(tree['state'], tree['train_metrics'], step, data.get('iterator'), extra,
               tree.get('hooks'))


def checkpoint_directory(path: str) -> str:
  """The checkpoint directory that ``path`` names: itself, or a ``purax
  train`` run directory's ``checkpoints/``. Missing is fine (nothing yet).

  Raises:
    ConfigError: ``path`` is a file, or a directory with entries that are
      not checkpoint steps (``100``, ``100.orbax-checkpoint-tmp-*``,
      ``100.unreadable-1``): not a checkpoint directory.
  """
  expect(not os.path.exists(path) or os.path.isdir(path), 'directory',
         'a checkpoint directory or a purax train run directory', f'{path!r}, a file',
         ConfigError)
  if os.path.isfile(os.path.join(path, 'config.json')):
    return os.path.join(path, 'checkpoints')       # a `purax train` run directory
  strangers = sorted(e for e in (os.listdir(path) if os.path.isdir(path) else ())
                     if not e.split('.', 1)[0].isdigit())
  expect(not strangers, 'directory',
         'a checkpoint directory (step directories such as 100/) or a purax train run '
         'directory (with config.json)',
         f'{path!r}, holding {strangers[:5]}{" ..." if len(strangers) > 5 else ""}',
         ConfigError)
  return path


from purax.core import lazy as _lazy  # noqa: E402

# restore_or_init moved beside fit (purax.resume) in 0.3: this public path is bound to it.
__getattr__, _ = _lazy.attach(__name__, {'restore_or_init': 'purax.resume:restore_or_init'})
