"""Resume from Python: the newest checkpoint of a directory, or a fresh state.

``fit`` checkpoints ``{'state': TrainState, 'train_metrics': window}`` with the
data position in the extra JSON; :func:`restore_or_init` is the inverse, for
research code as for ``purax train``::

  restored = purax.restore_or_init('runs/mine/checkpoints', task, jax.random.key(0), batch)
  state, history = purax.fit(task, restored.state, data, steps=1000,
                             train_metrics=restored.train_metrics,
                             data_state=restored.data_state,
                             checkpointer=Checkpointer('runs/mine/checkpoints'))
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

from purax.core.errors import ConfigError, expect
from purax.core.state import TrainState
from purax.io.checkpoint import Checkpointer


def abstract_checkpoint(task, batch, hooks=()) -> dict:
  """The abstract ``{'state', 'train_metrics'}`` tree that ``fit`` checkpoints,
  with ``'hooks': {name: ...}`` when a hook has array state (``init_arrays``)."""
  state = jax.eval_shape(task.init, jax.random.key(0), batch)
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
    data_state: an iterable's saved position (``fit(data_state=...)``), or None.
    extra: the checkpoint's JSON extra (``{}`` when fresh).
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


def restore_or_init(directory: str | Checkpointer, task, key: jax.Array, batch, *,
                    plan=None, hooks=()) -> Restored:
  """Restores the newest readable checkpoint in ``directory``, or initialises.

  Args:
    directory: a checkpoint directory (``fit``'s checkpointer's), a
      ``purax train`` run directory (its ``checkpoints/`` is used), or a
      :class:`Checkpointer`. A missing or empty directory initialises.
    task: the task whose state is restored (its shapes and dtypes must match:
      strict, never a cast).
    key: the PRNG key of a fresh state (``task.init(key, batch)``).
    batch: a sample batch (only shapes matter).
    plan: a :class:`purax.parallel.Sharded`: the state is restored (or
      created) directly in its sharding.
    hooks: the hooks the run will use; those with array state
      (:class:`purax.hooks.EMA`) get it restored (``Restored.hook_arrays``).
      Give the same hooks as the run that saved: a checkpoint saved with an
      array hook restored without it (or the reverse) is a
      :class:`CheckpointMismatchError` naming the ``hooks`` path.

  Returns:
    A :class:`Restored`.

  Raises:
    CheckpointMismatchError: the checkpoint's structure, shapes or dtypes
      differ from the task's state. ConfigError: a checkpoint whose data
      position disagrees with its state.
  """
  abstract = abstract_checkpoint(task, batch, hooks)
  if plan is not None:
    abstract['state'] = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract['state'],
        plan.state_sharding)
    # The metrics window and the hooks' arrays: replicated on the plan's mesh,
    # so that all the restored arrays live on the same devices (one device
    # otherwise, and the first jitted copy refuses the mix). EMA's jitted
    # update then carries the params' shardings over to its average.
    mesh = jax.tree.leaves(plan.state_sharding)[0].mesh
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    for name in [n for n in abstract if n != 'state']:
      abstract[name] = jax.tree.map(
          lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), abstract[name])
  checkpointer = directory
  if not isinstance(directory, Checkpointer):
    inner = os.path.join(directory, 'checkpoints')
    if os.path.isfile(os.path.join(directory, 'config.json')) and os.path.isdir(inner):
      directory = inner        # a `purax train` run directory: its checkpoints
    checkpointer = (Checkpointer(directory) if os.path.isdir(directory) and os.listdir(directory)
                    else None)
  if checkpointer is not None and checkpointer.steps():
    tree, extra, step = checkpointer.restore(abstract)
    data = extra.get('data', {})
    state_step = int(jax.device_get(tree['state'].step))
    expect(data.get('next_step', state_step) == state_step, 'checkpoint data position',
           f'next_step == state.step ({state_step}) in checkpoint {step}',
           data.get('next_step'), ConfigError)
    if checkpointer is not directory:
      checkpointer.close()
    return Restored(tree['state'], tree['train_metrics'], step, data.get('iterator'), extra,
                    tree.get('hooks'))
  state = plan.init(key) if plan is not None else jax.jit(task.init)(key, batch)
  return Restored(state, None, 0, None, {})
