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
  of ``(batch, steps_in_it)``, each batch as the step takes it: on the device,
  or numpy on the CPU (:func:`to_step`); ``train_step`` knows which it is:
  :class:`SingleDevice` marks multi-step calls as :class:`Stacked`;
- ``train_step(state, acc, batch) -> (state, acc)``: donates state and acc;
- ``evaluate(state, batches)``: the summed eval metrics tree (on device);
- ``finished(state) -> bool``: nothing can change any more (checked at log points).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Any, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from purax.core import loops
from purax.core import metrics as metrics_lib
from purax.core import population as pop_lib
from purax.core.errors import ConfigError, DataError, expect
from purax.io.pipeline import owned, prefetch_to_device
from purax.parallel import distributed


def _train_step(task, state, acc, batch):
  state, metrics = task.step(state, batch)
  return state, metrics_lib.merge(acc, metrics)


def _multi_train_step(task, state, acc, batches):
  """``k`` steps in one call: ``lax.scan`` of the step over stacked batches
  (every leaf ``[k, batch, ...]``), the metrics merged inside; unrolled on the
  CPU when the step has convolutions (:mod:`purax.core.loops`)."""
  def body(carry, batch):
    return _train_step(task, *carry, batch), None
  (state, acc), _ = loops.scan(body, (state, acc), batches)
  return state, acc


def _eval_step(task, state, acc, batch):
  return metrics_lib.merge(acc, task.evaluate(state, batch))


# Built once per process: the cache key is (task, shapes), so a second fit with
# the same task — e.g. another learning rate in the state — does not recompile.
# A program that holds unrolled steps (a convolution on the CPU: k steps per
# call, microbatches) is compiled with loops.UNROLLED_CPU_OPTIONS.
train_step = loops.Jit(
    _train_step, lambda task, state, acc, batch: task.microbatches > 1 and loops.step_unrolls(
        task, batch), static_argnums=0, donate_argnums=(1, 2))
multi_train_step = loops.Jit(
    _multi_train_step, lambda task, state, acc, batches: loops.step_unrolls(
        task, batches, stacked=True),
    static_argnums=0, donate_argnums=(1, 2))
eval_step = jax.jit(_eval_step, static_argnums=0, donate_argnums=2)


# The step's metrics structure, traced once per (task, shapes) (see _step_metrics use).
_step_metrics = jax.jit(lambda task, state, batch: task.step(state, batch)[1],
                        static_argnums=0)


def zero_metrics(fn, *args):
  """Zeroed metrics tree of the structure ``fn(*args)`` returns (no compute)."""
  return metrics_lib.zeros_like(jax.eval_shape(fn, *args))


class Stacked(struct.PyTreeNode):
  """``k`` batches stacked for one multi-step call (every leaf ``[k, batch, ...]``)."""

  batches: Any


def _stacked(batches: Iterable, start: int, k: int) -> Iterator:
  """Groups batches into :class:`Stacked` calls of ``k`` that end at multiples of
  ``k``; the steps before the first multiple (a resumed run) and after the last
  (a tail shorter than ``k``) come as single batches, run by the one-step
  program: a shorter scan would be another compilation.

  Each batch is copied once, into its slot of the call's new ``[k, ...]``
  arrays, as it arrives: a loader may refill its arrays once it has yielded
  them (:func:`purax.io.pipeline.owned`).

  Raises:
    DataError: a batch of a call whose structure, shapes or dtypes (as jit
      sees them, :func:`purax.core.loops.shapes_key`) differ from the call's
      first batch's.
  """
  step, n = start, 0
  treedef = key = stacks = None
  for batch in batches:
    if step % k and not n:             # not aligned yet: a single step
      step += 1
      yield batch
      continue
    leaves, tree = jax.tree.flatten(batch)
    if n == 0:
      treedef, key = tree, loops.shapes_key(leaves)
      stacks = [np.empty((k, *np.shape(x)), x.dtype if hasattr(x, 'dtype') else
                         np.asarray(x).dtype) for x in leaves]
    else:
      got = (tree, loops.shapes_key(leaves))
      expect(got == (treedef, key), f'train_data batch of step {step}',
             f'the structure, shapes and dtypes of the first batch of its call of '
             f'steps_per_call={k} ({treedef}, {key})', f'{got[0]}, {got[1]}', DataError)
    for stack, x in zip(stacks, leaves):
      stack[n] = x
    n += 1
    step += 1
    if step % k == 0:
      yield Stacked(jax.tree.unflatten(treedef, stacks))
      n, stacks = 0, None
  for i in range(n):                   # the tail: single steps
    yield jax.tree.unflatten(treedef, [stack[i] for stack in stacks])


#: The share of the step time that ``k > 1`` steps per call is counted to save,
#: by platform (:func:`choose_steps_per_call`), from ``benchmarks/step_overhead.py``
#: (k = 16 against k = 1): on the 2-core CPU the MLP gained 20-40% and the CNN
#: ~17% (its 16 steps unrolled and scheduled for memory, :mod:`purax.core.loops`;
#: 12x slower inside a rolled ``lax.scan``); on an H200 the CNN and the MLP, whose
#: steps are mostly dispatch and Python, ran 3.6x and 4.8x faster (a saving of
#: 72% and 79%). Other platforms count as accelerators.
MIN_GAIN = {'cpu': 0.1, 'accelerator': 0.5}


def choose_steps_per_call(step_s: float, compile_s: float, remaining: int | None,
                          cadence: int, *, call_s: float = 0.01, max_steps: int = 32,
                          min_gain: float | None = None, platform: str | None = None,
                          unrolled: bool = False) -> int:
  """The rule behind ``steps_per_call='auto'``: how many steps one call runs.

  ``k`` is the largest divisor of ``cadence`` (the loop's log / eval /
  checkpoint / hook steps, so every such point is a call boundary) that is at
  most ``min(max_steps, ceil(call_s / step_s))``: one call then runs about
  ``call_s`` (10 ms) of work, against which the per-call cost (Python, the
  dispatch, one host-to-device transfer) is small, and at most ``max_steps``
  batches are stacked on the device. ``k > 1`` compiles a second program
  (the scanned step), so it is chosen only when the run is long enough to pay
  for it: ``remaining * step_s * min_gain >= compile_s`` (the saving counted
  as ``min_gain`` of the step time, :data:`MIN_GAIN` by platform;
  ``compile_s`` is ~0 when the programs are cached, e.g. a second fit of the
  same task). An ``unrolled`` program (a step with convolutions on the CPU,
  :mod:`purax.core.loops`) holds the step ``k`` times and compiles about ``k``
  times as long: then the largest such ``k`` that pays for
  ``k * compile_s`` is taken. With an unknown length (``remaining=None``)
  only the step time decides.

  Args:
    step_s: measured seconds per single step (after compilation).
    compile_s: the first call's extra seconds (its compilation; ~0 if cached).
    remaining: steps left in the run, or None.
    cadence: the gcd of the loop's cadences (> 0).
    min_gain: the saving's share of the step time; default :data:`MIN_GAIN`
      of ``platform``.
    platform: ``'cpu'``, ``'gpu'``, ``'tpu'``; default ``jax.default_backend()``.
    unrolled: the ``k``-step program holds the step ``k`` times
      (:func:`purax.core.loops.unrolls`).

  Returns:
    ``k >= 1``, a divisor of ``cadence``.
  """
  if min_gain is None:
    platform = platform or jax.default_backend()
    min_gain = MIN_GAIN['cpu' if platform == 'cpu' else 'accelerator']
  want = max(1, min(max_steps, math.ceil(call_s / max(step_s, 1e-9))))
  for k in sorted((d for d in range(2, want + 1) if cadence % d == 0), reverse=True):
    if remaining is None or remaining * step_s * min_gain >= compile_s * (k if unrolled else 1):
      return k
    if not unrolled:
      break
  return 1


def to_step(batches: Iterable, prefetch: int, sharding=None, *, copied: bool = False
            ) -> Iterator:
  """Host batches as a plan's jitted step takes them.

  With a ``sharding``, or on an accelerator: put on the device ``prefetch``
  ahead (:func:`purax.io.pipeline.prefetch_to_device`), so each transfer
  overlaps the step before it. On the CPU without one: numpy, each batch a
  private copy (:func:`purax.io.pipeline.owned`), handed to the jitted call
  as it is. A ``jax.device_put`` ahead of the call cost 43 us of a 0.66 ms
  step of the digits MLP (2-core CPU, jax 0.10.2: 0.617 ms with numpy
  batches; ``device_put`` alone ~55 us of host time per batch), and a CPU
  "device" has no transfer to overlap. The call's transfer is the plan's
  own, made under :func:`host_batch_transfer`, so it passes a
  ``jax.transfer_guard('disallow')`` around ``fit``. ``copied``: the batches
  are private copies already (not copied again).
  """
  if sharding is None and jax.default_backend() == 'cpu':
    # Each batch copied (purax.io.pipeline.owned): the call may read a numpy
    # array's memory in place after it returns. Stacked calls are new arrays.
    return (b if copied or isinstance(b, Stacked) else owned(b) for b in batches)
  return prefetch_to_device(batches, prefetch, sharding)


def host_batch_transfer():
  """The context a plan calls its jitted step in: the host-to-device copy of a
  numpy batch (:func:`to_step`) is allowed, as an explicit ``jax.device_put``
  would be, whatever transfer guard the caller set. The step's other
  arguments (state, metrics) are already on the device."""
  return jax.transfer_guard_host_to_device('allow')


def _sum_eval(task, state, batches, step_fn, sharding=None):
  batches = iter(batches)
  first = next(batches, None)
  expect(first is not None, 'eval batches', 'at least one batch', 'none', ConfigError)
  acc = None
  for batch in to_step(itertools.chain([first], batches), 2, sharding):
    if acc is None:
      acc = zero_metrics(task.evaluate, state, batch)
    with host_batch_transfer():
      acc = step_fn(state, acc, batch)
  return acc


# What 'auto' knows of this process's compilations: the one-step program's
# compile seconds and the scanned programs built, by (task, batch shapes).
_compile_s: dict = {}
_multi_compiled: set = set()


PROBE_STEPS = 5   # 'auto': single steps timed before choosing k (the first compiles)



@dataclasses.dataclass(frozen=True)
class SingleDevice:
  """``task.step`` jitted on one device; ``steps_per_call`` steps per dispatch.

  ``steps_per_call = k > 1`` scans the step over ``k`` stacked batches: one
  host-to-device transfer and one Python iteration per ``k`` steps, with
  exactly the result of ``k`` single steps. Calls end at multiples of ``k``;
  steps before the first multiple (a resumed run) and after the last run
  one at a time (the one-step program: no compilation per tail length).

  ``steps_per_call='auto'`` runs the first :data:`PROBE_STEPS` steps one at a
  time and times them (the first call's host time is its compilation; one host
  sync, after the last probe step, gives the steps' time), then picks ``k`` by
  :func:`choose_steps_per_call` with ``cadence`` (a divisor of it, so log,
  eval and checkpoint points stay call boundaries). The result is the same
  whatever ``k`` (bitwise on CPU), so the choice never changes training.
  The compilation weighed is the one-step program's, timed at the first call
  of whichever fit compiled it (``k = 1`` fits time theirs too, without a
  sync); 0 once the ``k``-step program is compiled; unknown (infinite: no
  ``k > 1`` for a run of known length) when it was compiled outside a fit.
  The second call of ``k`` is timed too: if the scanned step is slower per
  step than the single one, the rest of the run goes back to ``k = 1``.
  """

  task: Any
  steps_per_call: int | str = 1
  cadence: int = 0
  chosen: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  def __post_init__(self):
    k = self.steps_per_call
    expect(k == 'auto' or (isinstance(k, int) and k >= 1),
           'steps_per_call', "an integer >= 1 or 'auto'", k, ConfigError)

  def start_step(self, state) -> int:
    return int(jax.device_get(state.step))

  def place(self, state):
    return state

  def zero_metrics(self, state, batch):
    # A cached abstract trace: a fresh lambda would trace the whole step again
    # at every fit (a quarter of a second for a small model).
    return metrics_lib.zeros_like(_step_metrics.eval_shape(self.task, state, batch))

  def device_batches(self, host_batches, *, start, num_steps, prefetch):
    k = self.steps_per_call
    if k == 'auto':
      return self._auto_batches(iter(host_batches), start, num_steps, prefetch)
    if k == 1:
      # The first call is timed (no sync): a later 'auto' fit of this task
      # then knows what its compilation cost.
      self.chosen['probe'] = {'calls': 0, 'last': 0, 'marks': []}
      return ((b, 1) for b in to_step(host_batches, prefetch))
    return self._batches(host_batches, start, prefetch, k)

  def _batches(self, host_batches, start, prefetch, k):
    calls = to_step(_stacked(host_batches, start, k), prefetch)
    return ((b, len(jax.tree.leaves(b.batches)[0]) if isinstance(b, Stacked) else 1)
            for b in calls)

  def _auto_batches(self, host_batches, start, num_steps, prefetch):
    # Held before their steps run: copied, as a loader may refill its arrays.
    probe = [owned(b) for b in itertools.islice(host_batches, PROBE_STEPS)]
    # train_step times these calls: the first call's host time (its tracing
    # and compilation: XLA dispatches the run itself asynchronously), then the
    # steps' run to the last probe step, the only one it syncs.
    self.chosen['probe'] = {'calls': 0, 'last': len(probe), 'marks': []}
    for b in to_step(probe, prefetch, copied=True):
      yield b, 1
    timed = self.chosen.pop('probe')
    marks = timed['marks']
    k = 1
    if len(probe) == PROBE_STEPS and len(marks) == 3:
      # The last mark is the probe steps' end; the first step's run starts as
      # its call returns, so all PROBE_STEPS runs lie between marks 1 and 2.
      step_s = (marks[2] - marks[1]) / PROBE_STEPS
      remaining = None if num_steps is None else num_steps - start - PROBE_STEPS
      key = timed['key']
      ideal = choose_steps_per_call(step_s, 0.0, None, self.cadence or 1)
      # Its scanned program compiled already (an earlier fit): nothing to weigh.
      # The one-step program compiled outside any timed first call (called
      # directly): its cost is unknown, so only an unbounded run takes k > 1.
      cost = 0.0 if (*key, ideal) in _multi_compiled else _compile_s.get(key, math.inf)
      k = choose_steps_per_call(step_s, cost, remaining, self.cadence or 1)
      if k > 1 and cost > 0 and loops.step_unrolls(self.task, probe[0]):   # k-fold compile
        k = choose_steps_per_call(step_s, cost, remaining, self.cadence or 1, unrolled=True)
    self.chosen['steps_per_call'] = k
    if k == 1:
      yield from ((b, 1) for b in to_step(host_batches, prefetch))
      return
    # The first two calls of k are timed: when the k-step program is slower per
    # step than the single one (a backend's loop that runs some op slowly, as
    # XLA:CPU's did for convolutions, purax.core.loops), the rest runs one
    # step per call (the stacks already built are sliced).
    self.chosen['check'] = []
    fallback = False
    for b, taken in self._batches(host_batches, start + len(probe), prefetch, k):
      if fallback and isinstance(b, Stacked):
        for i in range(taken):
          yield jax.tree.map(lambda x: x[i], b.batches), 1
        continue
      yield b, taken
      check = self.chosen.get('check')
      if check is not None and len(check) == 2:
        del self.chosen['check']
        if check[1] / k > step_s:
          fallback = True
          self.chosen['steps_per_call'] = 1

  def train_step(self, state, acc, batch):
    with host_batch_transfer():
      return self._train_step(state, acc, batch)

  def _train_step(self, state, acc, batch):
    if isinstance(batch, Stacked):
      _multi_compiled.add((self.task, loops.shapes_key(batch.batches, drop_leading=True),
                           len(jax.tree.leaves(batch.batches)[0])))
      check = self.chosen.get('check')
      if check is None or len(check) >= 2:
        return multi_train_step(self.task, state, acc, batch.batches)
      begin = time.perf_counter()
      state, acc = multi_train_step(self.task, state, acc, batch.batches)
      jax.block_until_ready(acc)       # 'auto' checks its choice on the first two calls
      check.append(time.perf_counter() - begin)
      return state, acc
    probe = self.chosen.get('probe')
    if probe is None:
      return train_step(self.task, state, acc, batch)
    probe['calls'] += 1
    if probe['calls'] > 1:
      state, acc = train_step(self.task, state, acc, batch)
    else:
      # The first call: its host time is its tracing and compilation when the
      # jit's cache grows (remembered per task and batch shapes), else ~0.
      cached = train_step._cache_size()
      probe['marks'].append(time.perf_counter())
      state, acc = train_step(self.task, state, acc, batch)
      probe['marks'].append(time.perf_counter())
      probe['key'] = (self.task, loops.shapes_key(batch))   # the dtypes jit sees
      if train_step._cache_size() > cached:
        _compile_s[probe['key']] = probe['marks'][1] - probe['marks'][0]
      if not probe['last']:                 # steps_per_call=1: only the first call is timed
        del self.chosen['probe']
    if probe['calls'] == probe['last']:
      jax.block_until_ready(acc)       # the last probe step of 'auto': its one host sync
      probe['marks'].append(time.perf_counter())
    return state, acc

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
    return ((b, 1) for b in to_step(host_batches, prefetch, self._batch_sharding()))

  def train_step(self, pop, acc, batch):
    with host_batch_transfer():
      return pop_lib.train_step(self.task, pop, acc, batch, self.batch_index,
                                strategy=self._strategy)

  def evaluate(self, pop, batches):
    acc = None
    replicated = None if self.mesh is None else self._sharding()
    for batch in to_step(batches, 2, replicated):   # copies on the CPU (owned)
      if acc is None:
        acc = pop_lib.zero_eval_metrics(self.task, pop, batch)
      with host_batch_transfer():
        acc = pop_lib.eval_step(self.task, pop, acc, batch, None, strategy=self._strategy)
    expect(acc is not None, 'eval batches', 'at least one batch', 'none', ConfigError)
    return acc

  def finished(self, pop) -> bool:
    return bool(np.all(jax.device_get(pop.frozen)))


def as_plan(plan, task, steps_per_call: int | str = 1, cadence: int = 0):
  """The plan ``fit`` drives: ``plan`` itself, a :class:`Sharded` around a
  ``purax.parallel.Sharded``, or :class:`SingleDevice` when None.

  ``steps_per_call='auto'`` with a plan is 1 (multi-step calls run on one
  device); ``cadence`` is what ``'auto'`` picks a divisor of.

  Raises:
    ConfigError: ``steps_per_call > 1`` with a plan other than single device.
  """
  if plan is None:
    return SingleDevice(task, steps_per_call, cadence)
  expect(steps_per_call in (1, 'auto'), 'steps_per_call', "1 or 'auto' with a plan "
         '(multi-step calls run on one device)', steps_per_call, ConfigError)
  if hasattr(plan, 'state_sharding') and hasattr(plan, 'mesh'):
    return Sharded(plan)
  return plan
