"""Resume from Python: the run's checkpoint layout, and the newest checkpoint
of a directory or a fresh state.

A run's checkpoint is :func:`checkpoint_tree` (arrays: ``{'state':
TrainState, 'train_metrics': window, 'hooks': {name: arrays}}``) with
:func:`checkpoint_extra` in its JSON (``{'data': position, 'hooks': {name:
state_dict}}``); :func:`restore_or_init` is the inverse, for research code as
for ``purax train``, and ``fit`` takes what it returns (the example of
:func:`restore_or_init`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np

from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, expect, expect_kind
from purax.core.state import TrainState
from purax.core.task import Task, as_typed_key
from purax.core.errors import CheckpointError
from purax.io.checkpoint.manager import Checkpointer
from purax.parallel.plan import Plan


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
  """What :func:`restore_or_init` found.

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


def restore_or_init(directory: str | Checkpointer, task, key: jax.Array, batch, *,
                    plan=None, hooks=(), move_aside: bool = False,
                    must_exist: bool = False) -> Restored:
  """Restores the newest readable checkpoint in ``directory``, or initialises.

  Args:
    directory: a checkpoint directory (``fit``'s checkpointer's), a
      ``purax train`` run directory (its ``checkpoints/`` is used), or a
      :class:`Checkpointer`. A path is opened read-only (unless
      ``move_aside``): nothing in it is created, cleaned up or renamed. A missing or empty directory (or one holding only
      unfinished saves) is "nothing here yet" and initialises.
    task: the task whose state is restored (its shapes and dtypes must match:
      strict, never a cast).
    key: the PRNG key of a fresh state (``task.init(key, batch)``).
    batch: a sample batch (only shapes matter).
    plan: the run's plan (:mod:`purax.plan`); a
      :class:`purax.parallel.ShardedPlan` restores (or creates) the state
      directly in its sharding.
    hooks: the hooks the run will use; those with array state
      (:class:`purax.hooks.EMA`) get it restored (``Restored.hook_arrays``).
      Give the same hooks as the run that saved: a checkpoint saved with an
      array hook restored without it (or the reverse) is a
      :class:`CheckpointMismatchError` naming the ``hooks`` path.
    move_aside: rename each unreadable checkpoint met on the way to
      ``STEP.unreadable-N`` (:meth:`Checkpointer.restore`; what ``purax train``
      does when it resumes).
    must_exist: require a checkpoint: "nothing here yet" is an error rather
      than a fresh state (for code that means to resume, e.g. evaluation).

  Returns:
    A :class:`Restored`.

  Raises:
    ConfigError: ``directory`` is a file, or a directory that holds other
      things than checkpoints (it is not a checkpoint directory: a typo'd or
      wrong path, never silently a fresh run); or a checkpoint whose data
      position disagrees with its state.
    CheckpointError: with ``must_exist``, no committed checkpoint.
    CheckpointMismatchError: the checkpoint's structure, shapes or dtypes
      differ from the task's state.

  Example: train 10 steps, then run the same code again: it resumes at step
  10 and trains to 20.

  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
  >>> for steps in (10, 20):                           # two runs of one script
  ...   ckpt = purax.Checkpointer('runs/mine/checkpoints')
  ...   restored = purax.restore_or_init(ckpt, task, jax.random.key(0), batch)
  ...   start = int(restored.state.step)                 # fit consumes restored
  ...   state, history = purax.fit(task, restored, batches, steps=steps,
  ...                              hooks=purax.hooks.standard(checkpointer=ckpt))
  ...   ckpt.close()
  ...   print(start, '->', int(state.step))
  0 -> 10
  10 -> 20
  """
  expect(isinstance(directory, (str, os.PathLike, Checkpointer)), 'directory',
         'a checkpoint or run directory, or a Checkpointer', type(directory).__name__,
         ConfigError)
  expect_kind(task, 'task', Task, 'a purax.Task')
  as_typed_key(key)
  expect(plan is None or isinstance(plan, Plan), 'plan', 'None or a purax.plan.Plan',
         type(plan).__name__, ConfigError)
  expect(hasattr(hooks, '__iter__') and not isinstance(hooks, (str, dict)), 'hooks',
         'a list of hooks', type(hooks).__name__, ConfigError)
  for name, value in (('move_aside', move_aside), ('must_exist', must_exist)):
    expect_kind(value, name, (bool, np.bool_), 'a bool')
  plan = Plan(task) if plan is None else plan
  abstract = plan.abstract_checkpoint(abstract_checkpoint(task, batch, hooks))
  checkpointer = directory
  if not isinstance(directory, Checkpointer):
    directory = checkpoint_directory(directory)
    # A path is only read: nothing in it is cleaned up or locked (a trainer may be
    # writing it); a Checkpointer given is the caller's, writer or reader.
    checkpointer = Checkpointer(directory, read_only=not move_aside) if os.path.isdir(
        directory) else None
  try:
    if checkpointer is not None and checkpointer.steps():
      return Restored.of(*checkpointer.restore(abstract, move_aside=move_aside))
  finally:
    if checkpointer is not None and checkpointer is not directory:
      checkpointer.close()
  if must_exist:
    raise CheckpointError(f'restore_or_init({directory!r}, must_exist=True): expected a '
                          'committed checkpoint, got none')
  return Restored(plan.init_state(key, batch), None, 0, None, {})


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
