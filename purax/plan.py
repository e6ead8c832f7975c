"""Plans: how ``fit`` places the state, runs one step and one evaluation, and
gets batches onto the devices. ``fit`` has one loop; the plan is what differs.

- :class:`SingleDevice` — ``jax.jit`` of ``task.step`` on one device (optionally
  ``k`` steps per call, ``lax.scan`` over stacked batches);
- :class:`Sharded` — a :func:`purax.parallel.sharded` plan: the same step
  jitted with ``NamedSharding`` in/out shardings on a mesh (data parallel,
  FSDP, tensor parallel), multi-host batches assembled per process;
- :class:`Population` — a stacked :class:`purax.core.population.Population`:
  every member's step vmapped in one compiled program, metrics ``[members]``.

A plan is any object with these methods (``fit`` calls nothing else):

- ``start_step(state) -> int``: the step to resume at (a host read);
- ``place(state) -> state``: put the state where the step runs;
- ``zero_metrics(state, batch)``: the zeroed running-metrics tree;
- ``device_batches(host_batches, *, start, num_steps, prefetch)``: an iterator
  of ``(batch_on_device, steps_in_it)``;
- ``train_step(state, acc, batch) -> (state, acc)``: donates state and acc;
- ``evaluate(state, batches)``: the summed eval metrics tree (on device);
- ``finished(state) -> bool``: nothing can change any more (checked at log points).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from purax.core import metrics as metrics_lib
from purax.core import population as pop_lib
from purax.core.errors import ConfigError, DataError, expect
from purax.io.pipeline import prefetch_to_device
from purax.parallel import distributed


def _train_step(task, state, acc, batch):
  state, metrics = task.step(state, batch)
  return state, metrics_lib.merge(acc, metrics)


def _multi_train_step(task, state, acc, batches):
  """``k`` steps in one call: ``lax.scan`` of the step over stacked batches
  (every leaf ``[k, batch, ...]``), the metrics merged inside."""
  def body(carry, batch):
    return _train_step(task, *carry, batch), None
  (state, acc), _ = jax.lax.scan(body, (state, acc), batches)
  return state, acc


def _eval_step(task, state, acc, batch):
  return metrics_lib.merge(acc, task.evaluate(state, batch))


# Built once per process: the cache key is (task, shapes), so a second fit with
# the same task — e.g. another learning rate in the state — does not recompile.
train_step = jax.jit(_train_step, static_argnums=0, donate_argnums=(1, 2))
multi_train_step = jax.jit(_multi_train_step, static_argnums=0, donate_argnums=(1, 2))
eval_step = jax.jit(_eval_step, static_argnums=0, donate_argnums=2)


def zero_metrics(fn, *args):
  """Zeroed metrics tree of the structure ``fn(*args)`` returns (no compute)."""
  return metrics_lib.zeros_like(jax.eval_shape(fn, *args))


def _stacked(batches: Iterable, start: int, num_steps: int | None, k: int) -> Iterator:
  """Groups batches into stacks (every leaf ``[n, ...]``) that end at multiples of ``k``."""
  step, group = start, []
  for batch in batches:
    if group:
      shapes = lambda b: [np.shape(x) for x in jax.tree.leaves(b)]   # noqa: E731
      expect(shapes(batch) == shapes(group[0]), f'train_data batch of step {step}',
             f'the shapes of the other batches of its call of steps_per_call={k} '
             f'({shapes(group[0])})', shapes(batch), DataError)
    group.append(batch)
    step += 1
    if step % k == 0 or step == num_steps:
      yield jax.tree.map(lambda *xs: np.stack(xs), *group)
      group = []
  if group:
    yield jax.tree.map(lambda *xs: np.stack(xs), *group)


def _sum_eval(task, state, batches, step_fn, sharding=None):
  batches = iter(batches)
  first = next(batches, None)
  expect(first is not None, 'eval batches', 'at least one batch', 'none', ConfigError)
  acc = None
  for batch in prefetch_to_device(itertools.chain([first], batches), 2, sharding):
    if acc is None:
      acc = zero_metrics(task.evaluate, state, batch)
    acc = step_fn(state, acc, batch)
  return acc


@dataclasses.dataclass(frozen=True)
class SingleDevice:
  """``task.step`` jitted on one device; ``steps_per_call`` steps per dispatch.

  ``steps_per_call = k > 1`` scans the step over ``k`` stacked batches: one
  host-to-device transfer and one Python iteration per ``k`` steps, with
  exactly the result of ``k`` single steps.
  """

  task: Any
  steps_per_call: int = 1

  def __post_init__(self):
    expect(isinstance(self.steps_per_call, int) and self.steps_per_call >= 1,
           'steps_per_call', 'an integer >= 1', self.steps_per_call, ConfigError)

  def start_step(self, state) -> int:
    return int(jax.device_get(state.step))

  def place(self, state):
    return state

  def zero_metrics(self, state, batch):
    return zero_metrics(lambda st, b: self.task.step(st, b)[1], state, batch)

  def device_batches(self, host_batches, *, start, num_steps, prefetch):
    k = self.steps_per_call
    if k == 1:
      return ((b, 1) for b in prefetch_to_device(host_batches, prefetch))
    stacks = prefetch_to_device(_stacked(host_batches, start, num_steps, k), prefetch)
    return ((b, len(jax.tree.leaves(b)[0])) for b in stacks)

  def train_step(self, state, acc, batch):
    if self.steps_per_call == 1:
      return train_step(self.task, state, acc, batch)
    return multi_train_step(self.task, state, acc, batch)

  def evaluate(self, state, batches):
    return _sum_eval(self.task, state, batches,
                     lambda s, acc, b: eval_step(self.task, s, acc, b))

  def finished(self, state) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class Sharded:
  """A :class:`purax.parallel.Sharded` plan (``parallel.sharded(task, mesh, rules,
  batch)``) driven by ``fit``: the state in its sharding, batches placed on the
  mesh; with several processes each feeds only its rows of every global batch."""

  compiled: Any   # purax.parallel.Sharded

  @property
  def task(self):
    return self.compiled.task

  def start_step(self, state) -> int:
    return int(jax.device_get(state.step))

  def place(self, state):
    return jax.device_put(state, self.compiled.state_sharding)   # no-op when placed

  def zero_metrics(self, state, batch):
    return zero_metrics(lambda st, b: self.task.step(st, b)[1], state, batch)

  def device_batches(self, host_batches, *, start, num_steps, prefetch):
    plan = self.compiled
    if jax.process_count() > 1:
      rows = distributed.process_rows(plan.mesh, plan.rules,
                                      len(jax.tree.leaves(plan.sample_batch)[0]))
      return ((distributed.global_batch(jax.tree.map(lambda v: v[rows], b), plan.mesh,
                                        plan.rules), 1) for b in host_batches)
    return ((b, 1) for b in prefetch_to_device(host_batches, prefetch, plan.batch_sharding))

  def train_step(self, state, acc, batch):
    return self.compiled.train_step(state, acc, batch)

  def evaluate(self, state, batches):
    plan = self.compiled
    return _sum_eval(self.task, state, batches,
                     lambda s, acc, b: metrics_lib.merge(acc, plan.evaluate(s, b)),
                     plan.batch_sharding)

  def finished(self, state) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class Population:
  """Every member of a :class:`purax.core.population.Population` stepped at once
  (``task.step`` vmapped; frozen members kept): one compiled program.

  On a ``mesh`` the same program is partitioned by XLA (GSPMD) along one axis:

  - ``shard='batch'``: every member's state replicated, each batch split along
    its batch axis over all the mesh's devices (data parallel for every member;
    the gradient all-reduce is XLA's);
  - ``shard='members'``: the member axis of the state split over the devices
    (each device trains its own members; the number of members must be a
    multiple of the mesh size), batches replicated.

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
  """

  task: Any
  batch_index: Any = None
  mesh: Any = None
  shard: str = 'batch'
  strategy: Any = 'auto'

  def __post_init__(self):
    expect(self.shard in ('batch', 'members'), 'shard', "'batch' or 'members'",
           repr(self.shard), ConfigError)

  def _sharding(self, *spec):
    return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(*spec))

  @property
  def _strategy(self):
    if self.mesh is not None and self.shard == 'members' and self.strategy == 'auto':
      return 'vmap'
    return self.strategy

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

  def _batch_sharding(self):
    if self.mesh is None:
      return None
    if self.shard == 'members':
      return self._sharding()
    leading = (None,) if self.batch_index is not None else ()   # [seeds, batch, ...]
    return self._sharding(*leading, self.mesh.axis_names)

  def zero_metrics(self, pop, batch):
    return pop_lib.zero_train_metrics(self.task, pop, batch, self.batch_index)

  def device_batches(self, host_batches, *, start, num_steps, prefetch):
    return ((b, 1) for b in prefetch_to_device(host_batches, prefetch, self._batch_sharding()))

  def train_step(self, pop, acc, batch):
    return pop_lib.train_step(self.task, pop, acc, batch, self.batch_index,
                              strategy=self._strategy)

  def evaluate(self, pop, batches):
    acc = None
    replicated = None if self.mesh is None else self._sharding()
    for batch in batches:
      if replicated is not None:
        batch = jax.device_put(batch, replicated)
      if acc is None:
        acc = pop_lib.zero_eval_metrics(self.task, pop, batch)
      acc = pop_lib.eval_step(self.task, pop, acc, batch, None, strategy=self._strategy)
    expect(acc is not None, 'eval batches', 'at least one batch', 'none', ConfigError)
    return acc

  def finished(self, pop) -> bool:
    return bool(np.all(jax.device_get(pop.frozen)))


def as_plan(plan, task, steps_per_call: int = 1):
  """The plan ``fit`` drives: ``plan`` itself, a :class:`Sharded` around a
  ``purax.parallel.Sharded``, or :class:`SingleDevice` when None.

  Raises:
    ConfigError: ``steps_per_call > 1`` with a plan other than single device.
  """
  if plan is None:
    return SingleDevice(task, steps_per_call)
  expect(steps_per_call == 1, 'steps_per_call', '1 with a plan (multi-step calls run on '
         'one device)', steps_per_call, ConfigError)
  if hasattr(plan, 'state_sharding') and hasattr(plan, 'mesh'):
    return Sharded(plan)
  return plan
