"""The sharded plan: the task's step jitted on a mesh with ``in_shardings`` /
``out_shardings``, the state donated.

:class:`ShardedPlan` (built by :func:`purax.parallel.sharded`) computes, once,
the shardings of the task's state and batch under some rules, and jits
``init``, a metrics-accumulating ``train_step`` and ``evaluate`` with them.
The step is :meth:`purax.Task.step` itself: data parallel, FSDP and tensor
parallel differ only in the shardings handed to ``jax.jit`` (GSPMD inserts
the collectives). Meshes, rules and multi-host batches are
:mod:`purax.parallel`'s.

Example (8 devices; on a CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=8``):
  >>> mesh = parallel.make_mesh(data=4, fsdp=2)
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
  >>> plan = parallel.sharded(task, mesh, parallel.fsdp(), batch)
  >>> state = plan.init_state(jax.random.key(0), batch)     # born sharded
  >>> state, history = purax.fit(task, state, batches, plan=plan)
  >>> int(state.step)
  20
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping

import jax
from jax.sharding import Mesh

from purax.core import metrics as metrics_lib
from purax.core.state import TrainState
from purax.core.task import Task
from purax.parallel import distributed
from purax.parallel.rules import Rules
from purax.parallel.shard import (batch_sharding, batch_shardings, logical_axes, replicated,
                                  state_shardings)
from purax.plan.protocol import Plan


def _deprecated(old: str, new: str) -> None:
  warnings.warn(f'purax: ShardedPlan.{old} is deprecated: use {new} (the plans share one '
                'naming: init_state, place, train_step; it goes in 0.4; CHANGELOG.md)',
                DeprecationWarning, stacklevel=3)


class ShardedPlan(Plan):
  """A task's compiled functions on one mesh, with their shardings: a plan
  (:mod:`purax.plan.protocol`) that :func:`purax.fit` drives, and the pieces
  to step by hand.

  With several processes each feeds only its rows of every global batch
  (:func:`purax.parallel.distributed.process_rows`).

  Args:
    task, mesh, rules, sample_batch, logical, checks, prefetch: as
      :func:`purax.parallel.sharded`, which builds it.

  Attributes:
    task, mesh, rules: what it was built from.
    state_sharding: a :class:`TrainState` of ``NamedSharding``.
    batch_sharding: one ``NamedSharding`` (leading axis split over the batch
      axes) that applies, as a pytree prefix, to every array of any batch:
      training batches, padded evaluation batches with ``'weight'``, or any
      other batch structure the task accepts.
    sample_batch: the batch whose shapes fixed the plan.
    train_step: ``(state, acc, batch) -> (state, acc)``, metrics merged into
      ``acc`` on the device; ``state`` and ``acc`` donated (as in ``fit``).
    eval_step: ``(state, batch) -> metrics`` of one batch (any structure,
      e.g. :func:`purax.io.pipeline.eval_batches`' padded ones).
    checks, prefetch: as :class:`purax.plan.Plan`.

  The names before 0.3 still work, deprecated until 0.4: ``init(key)``
  (:meth:`init_state`), ``shard_state(state)`` (``place`` in new buffers:
  ``jax.device_put(state, plan.state_sharding, may_alias=False)``) and
  ``step(state, batch) -> (state, metrics)`` (``train_step`` with a zeroed
  window, ``zero_metrics``).

  Raises:
    DataError: a malformed batch, or a batch size not divisible by the batch axes.
    ConfigError: rules naming an unknown mesh axis, or a tensor-parallel dimension
      that does not divide.
  """

  def __init__(self, task: Task, mesh: Mesh, rules: Rules, sample_batch: Mapping[str, Any], *,
               logical: TrainState | None = None, checks: str = 'first', prefetch: int = 2):
    super().__init__(task, checks=checks, prefetch=prefetch)
    if logical is None and rules.uses_logical:
      logical = logical_axes(task, sample_batch)
    abstract = jax.eval_shape(task.init, jax.random.key(0), sample_batch)
    s_state = state_shardings(abstract, mesh, rules, logical=logical)
    batch_shardings(sample_batch, mesh, rules)     # checks the batch size, naming the field
    s_batch = batch_sharding(mesh, rules)          # one prefix for every batch pytree
    repl = replicated(mesh)
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), sample_batch)
    self.mesh, self.rules, self.sample_batch = mesh, rules, sample_batch
    self.state_sharding, self.batch_sharding = s_state, s_batch
    self._init = jax.jit(lambda key: task.init(key, shapes_to_zeros(shapes)),
                         out_shardings=s_state)
    self._step = jax.jit(task.step, in_shardings=(s_state, s_batch),
                         out_shardings=(s_state, repl), donate_argnums=0)
    self.train_step = jax.jit(
        lambda s, acc, batch: metrics_lib.stepped(task.step, s, acc, batch),
        in_shardings=(s_state, repl, s_batch), out_shardings=(s_state, repl),
        donate_argnums=(0, 1))
    self.eval_step = jax.jit(task.evaluate, in_shardings=(s_state, s_batch),
                             out_shardings=repl)

  @property
  def init(self):
    """Deprecated since 0.3: :meth:`init_state` (``init``: the jitted ``key -> state``)."""
    _deprecated('init(key)', 'init_state(key, batch)')
    return self._init

  @property
  def step(self):
    """Deprecated since 0.3: ``train_step`` (``step``: the jitted ``(state, batch) ->
    (state, metrics)``, ``state`` donated)."""
    _deprecated('step(state, batch)', 'train_step(state, acc, batch)')
    return self._step

  def shard_state(self, state: TrainState) -> TrainState:
    """Deprecated since 0.3: ``place`` (``shard_state`` placed in new buffers)."""
    _deprecated('shard_state(state)', 'place(state) (or jax.device_put(state, '
                'plan.state_sharding, may_alias=False) for new buffers)')
    return jax.device_put(state, self.state_sharding, may_alias=False)

  def shard_batch(self, batch: Mapping[str, Any]) -> dict:
    """Places a global batch (the same on every process) on the mesh.

    Raises:
      DataError: a batch size not divisible by the batch axes.
    """
    return jax.device_put(batch, batch_shardings(batch, self.mesh, self.rules))

  def place(self, state):
    return jax.device_put(state, self.state_sharding)   # no-op when placed

  def for_task(self, task) -> ShardedPlan:
    """The same mesh and rules for ``task`` (its functions jitted anew)."""
    return ShardedPlan(task, self.mesh, self.rules, self.sample_batch, checks=self.checks,
                       prefetch=self.prefetch)

  def init_state(self, key, batch=None):
    """A fresh state born in its sharding (no device ever holds an unsharded
    FSDP parameter); ``batch`` is unused (the plan's sample batch fixed the shapes)."""
    return self._init(key)

  def abstract_checkpoint(self, abstract):
    """The state in its sharding; the metrics window and the hooks' arrays
    replicated on the mesh, so that all the restored arrays live on the same
    devices (one device otherwise, and the first jitted copy refuses the mix;
    EMA's jitted update then carries the params' shardings to its average)."""
    with_sharding = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)  # noqa: E731
    repl = replicated(self.mesh)
    return {name: jax.tree.map(with_sharding, tree, self.state_sharding) if name == 'state'
            else jax.tree.map(lambda a: with_sharding(a, repl), tree)
            for name, tree in abstract.items()}

  def _feed(self, batches, sharding, *, copied: bool = False):
    """With several processes, each global batch as this process's rows of it,
    assembled on the mesh; with one, as :class:`Plan` places it."""
    if jax.process_count() == 1:
      return super()._feed(batches, sharding, copied=copied)
    return (distributed.global_batch(
        jax.tree.map(lambda v: v[distributed.process_rows(
            self.mesh, self.rules, len(jax.tree.leaves(batch)[0]))], batch),
        self.mesh, self.rules) for batch in batches)

  def _eval_batch(self, state, acc, batch):
    return _merge(acc, self.eval_step(state, batch))

  def _zero_eval_metrics(self, state, batch):
    return metrics_lib.zeros_of(self.eval_step, state, batch)

  def lower(self, state, acc, batch):
    with_sharding = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)  # noqa: E731
    state = jax.tree.map(with_sharding, state, self.state_sharding)
    batch = jax.tree.map(lambda x: with_sharding(x, self.batch_sharding), batch)
    return self.train_step.lower(state, metrics_lib.window(acc), batch)


def sharded(task: Task, mesh: Mesh, rules: Rules, sample_batch: Mapping[str, Any], *,
            logical: TrainState | None = None, checks: str = 'first',
            prefetch: int = 2) -> ShardedPlan:
  """Builds the jitted ``init_state`` / ``train_step`` / ``evaluate`` of ``task`` on ``mesh``.

  Args:
    task: the task.
    mesh: from :func:`purax.parallel.make_mesh`.
    rules: :func:`~purax.parallel.data_parallel`, :func:`~purax.parallel.fsdp`
      or :func:`~purax.parallel.tensor_parallel` (or any :class:`Rules`).
    sample_batch: a global batch (``{'x': [batch, ...], 'y': [batch, ...]}``);
      only its shapes and dtypes matter.
    logical: the state's logical axes; default :func:`logical_axes` when the
      rules are tensor parallel.
    checks, prefetch: as :class:`purax.plan.Plan`.

  Returns:
    A :class:`ShardedPlan`.

  Raises:
    DataError: a malformed batch, or a batch size not divisible by the batch axes.
    ConfigError: rules naming an unknown mesh axis, or a tensor-parallel dimension
      that does not divide.
  """
  return ShardedPlan(task, mesh, rules, sample_batch, logical=logical, checks=checks,
                     prefetch=prefetch)


_merge = jax.jit(metrics_lib.merge)


def shapes_to_zeros(shapes):
  """Zeros of a tree of ``ShapeDtypeStruct`` (inside jit: free, shapes only)."""
  return jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype), shapes)
