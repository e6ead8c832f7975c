"""The population plan: every member of a :class:`purax.core.population.Population`
stepped at once (``task.step`` vmapped; frozen members kept), one program, and
the compiled programs it runs (``train_step``, ``eval_step``, their zeroed
metrics windows: :func:`zero_train_metrics`, :func:`zero_eval_metrics`). The
pure functions (``init``, ``step``, ``evaluate``, how members share the
machine) are :mod:`purax.core.population`'s.

Example (four learning rates, one compiled step for all):
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
  >>> pop = purax.core.population.init(
  ...     task, jax.random.split(jax.random.key(0), 4),
  ...     {'learning_rate': jnp.geomspace(1e-4, 3e-3, 4)}, batch)
  >>> pop, metrics = purax.plan.members.train_step(
  ...     task, pop, purax.plan.members.zero_train_metrics(task, pop, batch), batch)
  >>> purax.metrics.compute(metrics)['loss'].shape     # one loss per member
  (4,)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purax.core import loops
from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, expect
from purax.core.population import Population, Strategy, chunk_size, evaluate, step
from purax.plan.feed import host_batch_transfer
from purax.plan.protocol import Plan


def _train_step(task, pop, acc, batch, batch_index=None, *, strategy: Strategy = 'auto'):
  return metrics_lib.stepped(lambda p: step(task, p, batch, batch_index, strategy=strategy),
                             pop, acc)


def _eval_step(task, pop, acc, batch, batch_index=None, *, strategy: Strategy = 'auto'):
  return metrics_lib.merge(acc, evaluate(task, pop, batch, batch_index, strategy=strategy))


def _unrolled(task, pop, acc, batch, batch_index=None, *, strategy: Strategy = 'auto'):
  """Whether the members' loop of this call is unrolled (:mod:`purax.core.loops`):
  then its program is compiled with ``loops.UNROLLED_CPU_OPTIONS``."""
  members = jnp.shape(jax.tree.leaves(pop.state)[0])[0]
  if members == 1 or chunk_size(strategy, members) >= members:
    return False                        # no loop over members
  # With batch_index, a member's batch is one row of the pool.
  return loops.step_unrolls(task, batch, stacked=batch_index is not None)


# Compiled once per (task, strategy, shapes): new hyperparameter values or seeds
# of the same member count reuse the program. The population and the running
# metrics are donated.
train_step = loops.Jit(_train_step, _unrolled, static_argnums=0, static_argnames='strategy',
                       donate_argnums=(1, 2))
eval_step = loops.Jit(_eval_step, _unrolled, static_argnums=0, static_argnames='strategy',
                      donate_argnums=2)


def zero_train_metrics(task, pop: Population, batch, batch_index=None) -> dict[str, Any]:
  """Zeroed ``[members]`` metrics accumulator of ``train_step`` (no compute)."""
  return metrics_lib.zeros_of(lambda p, b, i: step(task, p, b, i, strategy='vmap')[1], pop,
                              batch, batch_index)


def zero_eval_metrics(task, pop: Population, batch, batch_index=None) -> dict[str, Any]:
  """Zeroed ``[members]`` metrics accumulator of ``eval_step`` (no compute)."""
  return metrics_lib.zeros_of(lambda p, b, i: evaluate(task, p, b, i, strategy='vmap'), pop,
                              batch, batch_index)


class PopulationPlan(Plan):
  """Every member of a population stepped at once, optionally on a mesh.

  On a ``mesh`` the same program is partitioned by XLA (GSPMD) along one axis:

  - ``shard='batch'``: every member's state replicated, each batch split along
    its batch axis over all the mesh's devices (data parallel for every member;
    the gradient all-reduce is XLA's);
  - ``shard='members'``: the member axis of the state split over the devices
    (each device trains its own members; the number of members must be a
    multiple of the mesh size), batches replicated.

  Metrics are ``[members]``; batches are not value-checked by default
  (``checks='none'``: a shared batch is checked by the single-run paths).

  Attributes:
    task: the task every member runs.
    batch_index: int32 ``[members]`` into stacked batches ``[n, batch, ...]``
      (member ``i`` reads stack ``batch_index[i]``), or None: one shared batch.
    mesh: a ``jax.sharding.Mesh``, or None: one device.
    shard: ``'batch'`` or ``'members'`` (with a mesh).
    strategy: how members share the machine (``'auto'``, ``'vmap'``,
      ``'chunked'``, ``'sequential'`` or a chunk size; see
      :func:`purax.core.population.chunk_size`); the same result whichever.
      With ``shard='members'``, ``'auto'`` vmaps (each device holds its own members).

  Raises:
    ConfigError: ``shard`` is neither ``'batch'`` nor ``'members'``.
  """

  def __init__(self, task, batch_index=None, *, mesh=None, shard: str = 'batch',
               strategy='auto', checks: str = 'none', prefetch: int = 2):
    super().__init__(task, checks=checks, prefetch=prefetch)
    expect(shard in ('batch', 'members'), 'shard', "'batch' or 'members'", repr(shard),
           ConfigError)
    self.batch_index, self.mesh, self.shard, self.strategy = batch_index, mesh, shard, strategy
    if mesh is not None and shard == 'members' and strategy == 'auto':
      self.strategy = 'vmap'

  def _sharding(self, *spec):
    return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(*spec))

  def start_step(self, pop) -> int:
    return int(np.max(jax.device_get(pop.state.step)))

  def place(self, pop):
    if self.mesh is None:
      return pop
    if self.shard == 'batch':
      return jax.device_put(pop, self._sharding())
    size = self.mesh.devices.size
    expect(pop.num_members % size == 0, 'members', f'a multiple of the mesh size {size} '
           "(shard='members')", pop.num_members, ConfigError)
    return jax.device_put(pop, self._sharding(self.mesh.axis_names))

  @property
  def batch_sharding(self):
    if self.mesh is None:
      return None
    if self.shard == 'members':
      return self._sharding()
    leading = (None,) if self.batch_index is not None else ()   # [seeds, batch, ...]
    return self._sharding(*leading, self.mesh.axis_names)

  def _eval_sharding(self):
    return None if self.mesh is None else self._sharding()      # replicated

  def zero_metrics(self, pop, batch):
    return metrics_lib.window(zero_train_metrics(self.task, pop, batch, self.batch_index))

  def train_step(self, pop, acc, batch):
    with host_batch_transfer():
      return train_step(self.task, pop, acc, batch, self.batch_index,
                                strategy=self.strategy)

  def _zero_eval_metrics(self, pop, batch):
    return zero_eval_metrics(self.task, pop, batch)

  def _eval_batch(self, pop, acc, batch):
    return eval_step(self.task, pop, acc, batch, None, strategy=self.strategy)

  def lower(self, pop, acc, batch):
    return train_step.lower(self.task, pop, metrics_lib.window(acc), batch,
                                    self.batch_index,
                                    strategy=self.strategy)
