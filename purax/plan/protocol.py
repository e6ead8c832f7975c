"""The plan protocol: how :func:`purax.fit` places the state, feeds the step
and sums an evaluation. ``fit`` has one loop; the plan is what differs.

A plan is a :class:`Plan` (subclass it and override what differs; every
method has a default for one device). Its public members, all of them:

- ``task``, ``checks``, ``prefetch``: what it steps, how its batches' values
  are checked, how many batches go to the device ahead (the constructor's);
- ``batch_sharding``, ``state_sharding``: where batches and the state live
  (None: the default device);
- ``start_step(state) -> int``: the step to resume at (a host read);
- ``init_state(key, batch) -> state``: a fresh state where the step runs;
- ``place(state) -> state``: put a state (e.g. a restored one) where the step runs;
- ``abstract_checkpoint(abstract) -> abstract``: a run's abstract checkpoint
  tree with the shardings to restore it onto (:func:`purax.restore_or_init`);
- ``checked(batches) -> batches``: the host batches with their values
  checked (``checks``: the first batch, every batch, or none);
- ``zero_metrics(state, batch)``: the zeroed running-metrics window
  (:class:`purax.core.metrics.Window`, or a tree);
- ``device_batches(host_batches, loop) -> iterator of (batch, steps)``: each
  call's input as ``train_step`` takes it, and how many steps it runs
  (``loop``: what ``fit`` knows of the run, private: ``steps_per_call``,
  ``step``, ``num_steps``, ``cadence``, ``alone``, ``fresh_batches``);
- ``train_step(state, acc, batch) -> (state, acc)``: donates ``state`` and ``acc``;
- ``evaluate(state, batches)``: the summed evaluation metrics tree (on device);
- ``lower(state, acc, batch)``: the train step's ``jax.stages.Lowered`` for
  abstract arguments (``purax train --dry-run``);
- ``for_task(task) -> Plan``: the same placement for another task.

How batches get to the step (copy, stack, prefetch, transfer) is
:mod:`purax.plan.feed`. The default :meth:`Plan.evaluate` is built on three
private methods a plan may override: ``_eval_batch(state, acc, batch)``,
``_zero_eval_metrics(state, batch)`` and ``_eval_sharding()`` (before 0.3 they
were public without the underscore, and ``feed``: those spellings still work,
deprecated, until 0.4).

Provided: :class:`purax.plan.SingleDevicePlan` (one device, ``k`` steps per
call), :class:`purax.plan.ShardedPlan` (:func:`purax.parallel.sharded`: a
mesh) and :class:`purax.plan.PopulationPlan` (a vmapped population).
"""

from __future__ import annotations

import copy
import itertools
import warnings
from typing import Any, Iterable, Iterator, Literal

import jax

from purax.core import metrics as metrics_lib
from purax.core import objectives
from purax.core.errors import ConfigError, expect
from purax.plan import feed as feed_lib
from purax.plan.feed import host_batch_transfer as host_batch_transfer
from purax.plan.feed import to_step as to_step

_step_metrics = jax.jit(lambda task, state, batch: task.step(state, batch)[1],
                        static_argnums=0)
_eval_step = jax.jit(lambda task, state, acc, batch: metrics_lib.merge(
    acc, task.evaluate(state, batch)), static_argnums=0, donate_argnums=2)


_abstract_predict = jax.jit(lambda task, state, batch: task.predict(state, batch),
                            static_argnums=0)


def check_values(task, batch, state=None) -> None:
  """Checks ``batch``'s *values* on the host (numpy), where ``task``'s loss
  declares how (:class:`purax.core.objectives.LossSpec`): for the provided
  losses, labels / token ids in range and weights finite and >= 0. Not
  traced, so never in a compiled step: a plan's ``checks`` runs it.

  Raises:
    DataError: naming the field, the expected range and the values found.
  """
  check = objectives.spec_of(task.loss).check_values
  if check is None:
    return
  state = task.abstract_state(batch) if state is None else state
  outputs = _abstract_predict.eval_shape(task, state, batch)
  check(tuple(getattr(outputs, 'shape', ())), jax.device_get(batch))


def _checked(batches, check):
  for batch in batches:
    check(batch)
    yield batch


#: The protocol's helpers before 0.3 -> their names now (private: the default
#: ``evaluate``'s, and ``purax.plan.feed``'s).
_RENAMED = {'feed': '_feed', 'eval_batch': '_eval_batch', 'eval_sharding': '_eval_sharding',
            'zero_eval_metrics': '_zero_eval_metrics'}


class Plan:
  """One device: the defaults of the plan protocol (see the module docstring).

  Attributes:
    task: the :class:`purax.Task` the plan steps.
    checks: value checks of the training batches on the host
      (:func:`check_values`: labels and token ids in range,
      weights finite and >= 0): ``'first'`` batch (before anything
      compiles), ``'every'`` batch (a host pass over each: for debugging
      data) or ``'none'``. Shapes and dtypes are always checked, at trace time.
    prefetch: batches put on the device ahead of the step (an accelerator
      or a mesh; :func:`to_step`).
  """

  def __init__(self, task, *, checks: Literal['first', 'every', 'none'] = 'first',
               prefetch: int = 2):
    expect(checks in ('first', 'every', 'none'), 'checks', "'first', 'every' or 'none'",
           repr(checks), ConfigError)
    expect(isinstance(prefetch, int) and prefetch >= 1, 'prefetch', 'an integer >= 1',
           prefetch, ConfigError)
    self.task, self.checks, self.prefetch = task, checks, prefetch

  def __init_subclass__(cls, **kwargs):
    """A subclass that overrides a helper by its name before 0.3 (``eval_batch``,
    ...) still has it called, with a DeprecationWarning naming the new one."""
    super().__init_subclass__(**kwargs)
    for old, new in _RENAMED.items():
      if old in cls.__dict__ and new not in cls.__dict__:
        warnings.warn(f'purax: {cls.__name__}.{old} overrides a deprecated name of '
                      f'purax.plan.Plan: name it {new} (the old name goes in 0.4; CHANGELOG.md)',
                      DeprecationWarning, stacklevel=2)
        setattr(cls, new, cls.__dict__[old])

  def __getattr__(self, name: str):
    if name in _RENAMED:       # a spelling before 0.3
      warnings.warn(f'purax: Plan.{name} is deprecated: use Plan.{_RENAMED[name]} (it goes '
                    'in 0.4; CHANGELOG.md)', DeprecationWarning, stacklevel=2)
      return getattr(self, _RENAMED[name])
    raise AttributeError(f'{type(self).__name__!r} object has no attribute {name!r}')

  #: The device sharding batches are placed with (None: the default device).
  batch_sharding: Any = None
  #: The state's shardings (a pytree of them), or None: one device.
  state_sharding: Any = None

  def for_task(self, task) -> 'Plan':
    """This plan's placement for another task with a state of the same
    structure (e.g. the task that evaluates a schedule-free optimizer's
    average as plain params): a copy that steps ``task``."""
    plan = copy.copy(self)
    plan.task = task
    return plan

  def init_state(self, key, batch):
    """A fresh state (``task.init(key, batch)``) where the step runs."""
    return self.place(jax.jit(self.task.init)(key, batch))

  def abstract_checkpoint(self, abstract: dict) -> dict:
    """A run's abstract checkpoint tree (:func:`purax.io.checkpoint.run.abstract_checkpoint`)
    with the shardings to restore it onto (default: as it is, one device)."""
    return abstract

  def start_step(self, state) -> int:
    return int(jax.device_get(state.step))

  def place(self, state):
    return state

  def checked(self, batches: Iterator) -> Iterator:
    """``batches`` with their values checked (``checks``); the first is read now."""
    if self.checks == 'none':
      return batches
    first = next(batches, None)
    if first is None:
      return iter(())
    abstract = self.task.abstract_state(first)   # no transfer; traced once per shapes
    check_values(self.task, first, abstract)
    rest = batches if self.checks == 'first' else _checked(
        batches, lambda b: check_values(self.task, b, abstract))
    return itertools.chain([first], rest)

  def zero_metrics(self, state, batch):
    # A cached abstract trace: a fresh lambda would trace the whole step again
    # at every fit (a quarter of a second for a small model).
    return metrics_lib.zeros_like(metrics_lib.window(
        _step_metrics.eval_shape(self.task, state, batch)))

  def device_batches(self, host_batches: Iterable, loop) -> Iterator:
    """``(batch, 1)`` per host batch: one step per call.

    Raises:
      ConfigError: ``loop.steps_per_call`` is an integer > 1 (only
        :class:`purax.plan.SingleDevicePlan` runs several steps per call).
    """
    expect(loop.steps_per_call in (1, 'auto'), 'steps_per_call',
           f"1 or 'auto' with a {type(self).__name__} (several steps per call run on "
           'one device: SingleDevicePlan)', loop.steps_per_call, ConfigError)
    return ((b, 1) for b in self._feed(host_batches, self.batch_sharding,
                                       copied=loop.fresh_batches))

  def _feed(self, batches: Iterable, sharding, *, copied: bool = False) -> Iterator:
    """Host batches as the jitted functions take them, placed with ``sharding``
    (:func:`purax.plan.feed.to_step`; ``copied``: they need no private copy):
    the one placement of training and evaluation batches."""
    return feed_lib.to_step(batches, self.prefetch, sharding, copied=copied)

  def train_step(self, state, acc, batch):
    raise NotImplementedError

  def _eval_batch(self, state, acc, batch):
    """``acc`` plus the metrics of one evaluation batch (``acc`` donated)."""
    return _eval_step(self.task, state, acc, batch)

  def _eval_sharding(self):
    """The sharding evaluation batches are placed with (default :attr:`batch_sharding`)."""
    return self.batch_sharding

  def _zero_eval_metrics(self, state, batch):
    return metrics_lib.zeros_of(self.task.evaluate, state, batch)

  def evaluate(self, state, batches: Iterable):
    """The summed metrics tree of ``batches``, on the device; their values are
    checked as training batches are (``checks``).

    Raises:
      ConfigError: no batches. DataError: a value check failed.
    """
    acc = None
    for batch in self._feed(self.checked(iter(batches)), self._eval_sharding()):
      if acc is None:
        acc = self._zero_eval_metrics(state, batch)
      with host_batch_transfer():
        acc = self._eval_batch(state, acc, batch)
    expect(acc is not None, 'eval batches', 'at least one batch', 'none', ConfigError)
    return acc

  def lower(self, state, acc, batch):
    """The train step's ``jax.stages.Lowered`` for these arguments (abstract
    or real; nothing runs): ``.compile()`` it to read XLA's memory and cost
    analysis (:func:`purax.plan.fit_memory`)."""
    raise NotImplementedError
