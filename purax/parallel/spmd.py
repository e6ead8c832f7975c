"""Per-device programs: a ``shard_map`` data-parallel step and the legacy ``pmap`` path.

Both run :meth:`purax.Task.step` on each device's part of the global batch
with ``axis_name`` set, so gradients are combined explicitly (a weighted
``psum``; ``pmean`` when every device holds as many examples), metrics are
summed, and models with an ``axis_name`` field (``purax.nn.ResNet``'s
BatchNorm) sum their batch statistics' sums and counts across devices (the
global batch's moments, also when devices hold different numbers of real
rows). Each device draws
its dropout mask from ``fold_in(step_key, device_index)``: distinct per
device, and the state's ``rng`` is left replicated.

Prefer :func:`purax.parallel.sharded` (``jax.jit`` + ``NamedSharding``):
it is the same computation with the collectives chosen by the compiler. Use
:func:`shard_map_step` to control the collectives yourself and
:func:`pmap_step` when porting ``jax.pmap`` code.

Example (pmap):
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
  >>> step = parallel.pmap_step(task)
  >>> state = parallel.replicate(task.init(jax.random.key(0), batch))
  >>> state, metrics = step(state, parallel.split_batch(batch, jax.local_device_count()))
  >>> state, metrics = parallel.unreplicate((state, metrics))
  >>> int(state.step)
  1
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from purax.core.errors import ConfigError, DataError, expect
from purax.core.model import Linen
from purax.core.task import Task
from purax.parallel.rules import Rules, data_parallel


def with_axis_name(task: Task, axis_name) -> Task:
  """``task`` whose model's ``axis_name`` field (if it has one) is ``axis_name``.

  ``purax.nn.ResNet`` passes it to its BatchNorm layers, which then reduce
  their statistics across the named axis, as on the global batch.
  """
  model = task.model
  module = model.module if isinstance(model, Linen) else model
  if isinstance(module, nn.Module) and any(f.name == 'axis_name'
                                           for f in dataclasses.fields(module)):
    module = module.clone(axis_name=axis_name)
    model = dataclasses.replace(model, module=module) if isinstance(model, Linen) else module
  return dataclasses.replace(task, model=model)


def check_state_reduced(task: Task, mesh: Mesh, axes, state, batch) -> None:
  """Refuses a model whose ``model_state`` would differ per device.

  Traces the training forward pass under ``jax.shard_map`` with
  ``check_vma=True`` (JAX's own tracking of which values vary across
  devices) and the new ``model_state`` declared replicated: it traces only
  if the model reduces its state across ``axes`` itself (BatchNorm with
  ``axis_name``; linen modules with an ``axis_name`` field get it set, as
  ``purax.nn.ResNet``). Otherwise the replicated result would silently keep
  one device's batch statistics, and the normalisation would use each
  device's part of the batch.

  Args:
    axes: the batch axes of ``mesh`` the batch is split over.
    state, batch: a state and a global batch ``[batch, ...]`` (shapes only).

  Raises:
    ConfigError: naming the model and how to declare the axis.
  """
  axes = tuple(a for a in axes if mesh.shape[a] > 1)   # a size-1 axis splits nothing
  if not jax.tree.leaves(state.model_state) or not axes:
    return
  local = with_axis_name(task, axes)

  def forward(params, model_state, hparams, batch):
    return local.pure_model.apply(params, model_state, batch, train=True,
                                  rng=jax.random.key(0), hparams=hparams)[1]

  checked = jax.shard_map(forward, mesh=mesh, in_specs=(P(), P(), P(), P(axes)),
                          out_specs=P(), check_vma=True)
  try:
    jax.eval_shape(checked, state.params, state.model_state, state.hparams, batch)
  except ValueError as e:
    if 'vary' not in str(e) and 'vma' not in str(e):
      raise
    names = axes[0] if len(axes) == 1 else axes
    raise ConfigError(
        f'model_state: expected a model that reduces its state across the devices '
        f'(batch axes {axes}) on this per-device path, got {_model_name(task)}, whose '
        f'new model_state differs per device (each device\'s batch statistics). Declare '
        f'the axis in the model: flax BatchNorm(axis_name={names!r}), '
        f'nnx.BatchNorm(..., axis_name={names!r}), an Equinox BatchNorm over '
        f"('batch', {names!r}) — or train with purax.parallel.sharded (jit over the "
        'global batch: the statistics are the whole batch\'s)') from None


def _model_name(task: Task) -> str:
  """The user's model class behind an adapter (linen, NNX, Equinox), for messages."""
  model = task.model
  for inner in (getattr(model, 'module', None), getattr(model, 'static', None)):
    if inner is not None:
      return type(inner).__name__
  found = re.search(r"type='?(\w+)", repr(getattr(model, 'graphdef', '')))
  return f'NNX {found.group(1)}' if found else type(model).__name__


def _per_device_step(task: Task, axis_name) -> Callable:
  local_task = with_axis_name(task, axis_name)

  def step(state, batch):
    index = jax.lax.axis_index(axis_name)
    local = state.replace(rng=jax.random.fold_in(state.rng, index))
    new, metrics = local_task.step(local, batch, axis_name=axis_name)
    return new.replace(rng=state.rng), metrics

  return step


def shard_map_step(task: Task, mesh: Mesh, rules: Rules | None = None) -> Callable:
  """A jitted data-parallel ``(state, batch) -> (state, metrics)`` written with ``jax.shard_map``.

  Args:
    task: the task.
    mesh: the mesh; the state is replicated over it.
    rules: only ``rules.batch_axes`` is used (default ``('data', 'fsdp')``).

  Returns:
    A function of a replicated state and a global batch ``[batch, ...]``
    whose leading axis is split over the batch axes; the state is donated.

  Raises:
    ConfigError: the rules name an axis the mesh lacks (at build time); the
      model's state would differ per device (:func:`check_state_reduced`, at
      the first call).
    DataError: a batch size not divisible by the batch axes (at call time).
  """
  rules = rules or data_parallel()
  rules.check(mesh)
  axes = tuple(rules.batch_axes)
  size = 1
  for a in axes:
    size *= mesh.shape[a]
  # check_vma=False: classic per-device semantics (as pmap). With it on, the
  # gradient of a replicated parameter is summed across devices by autodiff
  # itself, and the explicit weighted psum of Task.step would count it twice.
  body = jax.shard_map(_per_device_step(task, axes), mesh=mesh,
                       in_specs=(P(), P(axes)), out_specs=(P(), P()),
                       check_vma=False)
  jitted = jax.jit(body, donate_argnums=0)
  checked = False

  def step(state, batch):
    nonlocal checked
    n = jnp.shape(jax.tree.leaves(batch)[0])[0]
    expect(n % size == 0, "the batch's leading axis (global batch size)",
           f'a multiple of {size} (the batch axes {axes})', n, DataError)
    if not checked:   # once (a trace, no compile): no per-step host work after it
      check_state_reduced(task, mesh, axes, state, batch)
      checked = True
    return jitted(state, batch)

  return step


def pmap_step(task: Task, axis_name: str = 'batch', *,
              devices: Sequence[jax.Device] | None = None) -> Callable:
  """The legacy ``jax.pmap`` data-parallel step (explicit ``pmean`` of gradients).

  Args:
    task: the task.
    axis_name: the pmapped axis name (BatchNorm reduces its statistics over it).
    devices: the devices (default: all local devices).

  Returns:
    ``(state, batch) -> (state, metrics)`` on a replicated state (leading
    ``[devices]`` axis, :func:`replicate`) and a split batch ``[devices,
    batch / devices, ...]`` (:func:`split_batch`); the state is donated.

  Raises:
    ConfigError: the model's state would differ per device
      (:func:`check_state_reduced`), at the first call.
  """
  mapped = jax.pmap(_per_device_step(task, axis_name), axis_name=axis_name,
                    devices=devices, donate_argnums=0)
  checked = []

  def step(state, batch):
    if not checked:   # the state reduction, as shard_map_step checks it
      used = list(devices or jax.local_devices())[:jax.tree.leaves(batch)[0].shape[0]]
      one = jax.tree.map(lambda x: x[0], state)
      merged = jax.tree.map(lambda x: jnp.reshape(x, (-1, *x.shape[2:])), batch)
      check_state_reduced(task, Mesh(np.array(used), (axis_name,)), (axis_name,), one, merged)
      checked.append(True)
    return mapped(state, batch)

  return step


def replicate(tree: Any, num_devices: int | None = None) -> Any:
  """Stacks ``num_devices`` copies of every leaf: ``[...] -> [devices, ...]``."""
  n = num_devices or jax.local_device_count()
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *jnp.shape(x))), tree)


def unreplicate(tree: Any) -> Any:
  """The first copy of every leaf: ``[devices, ...] -> [...]``."""
  return jax.tree.map(lambda x: x[0], tree)


def split_batch(batch: Any, num_devices: int | None = None) -> Any:
  """Reshapes ``[batch, ...]`` leaves to ``[devices, batch / devices, ...]``.

  Raises:
    DataError: the batch size is not a multiple of ``num_devices``.
  """
  n = num_devices or jax.local_device_count()

  def split(path, x):
    b = jnp.shape(x)[0]
    expect(b % n == 0, f'batch{jax.tree_util.keystr(path)}.shape[0]',
           f'a multiple of {n} (devices)', b)
    return jnp.reshape(x, (n, b // n, *jnp.shape(x)[1:]))

  return jax.tree_util.tree_map_with_path(split, batch)
