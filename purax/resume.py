"""``restore_or_init``: the newest checkpoint of a directory, or a fresh state,
placed by the run's plan. Beside :func:`purax.fit` (:mod:`purax.loop`), which
takes what it returns: the checkpoint layout it reads is
:mod:`purax.io.checkpoint.run`'s, the placement the plan's
(:meth:`purax.plan.protocol.Plan.abstract_checkpoint`,
:meth:`purax.plan.protocol.Plan.init_state`).
"""

from __future__ import annotations

import os

import jax
import numpy as np

from purax.core.errors import ConfigError, expect, expect_kind
from purax.core.task import Task, as_typed_key
from purax.core.errors import CheckpointError
from purax.io.checkpoint.manager import Checkpointer
from purax.io.checkpoint.run import Restored, abstract_checkpoint, checkpoint_directory
from purax.plan.protocol import Plan


def restore_or_init(directory: str | Checkpointer, task, key: jax.Array, batch, *,
                    plan=None, hooks=(), move_aside: bool = False,
                    must_exist: bool = False) -> Restored:
  """Restores the newest readable checkpoint in ``directory``, or initialises.

  Args:
    directory: a checkpoint directory (``fit``'s checkpointer's), a
      ``purax train`` run directory (its ``checkpoints/`` is used), or a
      :class:`purax.io.checkpoint.Checkpointer`. A path is opened read-only (unless
      ``move_aside``): nothing in it is created, cleaned up or renamed. A
      missing or empty directory (or one holding only unfinished saves) is
      "nothing here yet" and initialises.
    task: the task whose state is restored (its shapes and dtypes must match:
      strict, never a cast).
    key: the PRNG key of a fresh state (``task.init(key, batch)``).
    batch: a sample batch (only shapes matter).
    plan: the run's plan (:mod:`purax.plan`); a
      :class:`purax.plan.ShardedPlan` restores (or creates) the state
      directly in its sharding.
    hooks: the hooks the run will use; those with array state
      (:class:`purax.hooks.EMA`) get it restored (``Restored.hook_arrays``).
      Give the same hooks as the run that saved: a checkpoint saved with an
      array hook restored without it (or the reverse) is a
      :class:`purax.io.checkpoint.CheckpointMismatchError` naming the
      ``hooks`` path.
    move_aside: rename each unreadable checkpoint met on the way to
      ``STEP.unreadable-N`` (:meth:`purax.io.checkpoint.Checkpointer.restore`;
      what ``purax train`` does when it resumes).
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
