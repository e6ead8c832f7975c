"""One device: ``task.step`` jitted once, one or ``k`` steps per call."""

from __future__ import annotations

import time
from typing import Iterable, Iterator

import jax

from purax.core import loops
from purax.core import metrics as metrics_lib
from purax.plan import auto
from purax.plan.feed import Stacked, host_batch_transfer, stacked, to_step
from purax.plan.protocol import Plan


def _train_step(task, state, acc, batch):
  return metrics_lib.stepped(task.step, state, acc, batch)


def _multi_train_step(task, state, acc, batches):
  """``k`` steps in one call: ``lax.scan`` of the step over stacked batches
  (every leaf ``[k, batch, ...]``), the metrics merged inside; unrolled on the
  CPU when the step has convolutions (:mod:`purax.core.loops`)."""
  def body(carry, batch):
    return _train_step(task, *carry, batch), None
  (state, acc), _ = loops.scan(body, (state, acc), batches)
  return state, acc


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


class SingleDevicePlan(Plan):
  """``task.step`` jitted on one device; ``fit``'s ``steps_per_call`` steps per call.

  ``steps_per_call = k > 1`` scans the step over ``k`` stacked batches
  (:func:`purax.plan.feed.stacked`): one host-to-device transfer and one Python iteration
  per ``k`` steps, with exactly the result of ``k`` single steps (bitwise on
  the CPU). ``'auto'``: :mod:`purax.plan.auto` chooses ``k``; the choice of
  the last ``fit`` is ``chosen_steps_per_call``.

  Attributes:
    task, checks, prefetch: as :class:`purax.plan.Plan`.
    chosen_steps_per_call: the ``k`` the last ``fit`` ran (None before one).
  """

  chosen_steps_per_call: int | None = None

  def device_batches(self, host_batches, loop):
    k = loop.steps_per_call
    if k == 'auto':
      return auto.auto_batches(self, iter(host_batches), loop)
    self.chosen_steps_per_call = k
    return auto.timed_first(self, self.calls(host_batches, k, loop))

  def calls(self, host_batches: Iterable, k: int, loop) -> Iterator:
    """``(input, steps)`` of each call from ``loop.step`` on, ``k`` steps per call."""
    if k == 1:
      return ((b, 1) for b in to_step(host_batches, self.prefetch, copied=loop.fresh_batches))
    batches = to_step(stacked(host_batches, loop.step, k, loop.alone, fresh=loop.fresh_batches),
                      self.prefetch, copied=True)
    return ((b, b.steps if isinstance(b, Stacked) else 1) for b in batches)

  @staticmethod
  def singles(calls: Iterator) -> Iterator:
    """The batches of ``calls``, one step each (stacked calls sliced)."""
    for b, taken in calls:
      if taken > 1:          # a Stacked call
        yield from (jax.tree.map(lambda x, i=i: x[i], b.batches) for i in range(taken))
      else:
        yield b

  def _program(self, batch):
    """``(compiled program, its input)`` of a call: the ``k``-step scan of a
    :class:`purax.plan.feed.Stacked`, else the one-step program. The one place
    a call's input is told apart."""
    if isinstance(batch, Stacked):
      return multi_train_step, batch.batches
    return train_step, batch

  def _call(self, state, acc, program, inputs):
    if program is multi_train_step:
      auto.COMPILED.multi.add((self.task, loops.shapes_key(inputs, drop_leading=True),
                               len(jax.tree.leaves(inputs)[0])))
    return program(self.task, state, acc, inputs)

  def train_step(self, state, acc, batch):
    timed = batch if isinstance(batch, auto.Timed) else None   # a call 'auto' measures
    program, inputs = self._program(batch if timed is None else timed.batch)
    with host_batch_transfer():
      if timed is None:
        return self._call(state, acc, program, inputs)
      cache = getattr(program, '_cache_size', lambda: 0)
      cached = cache()
      begin = time.perf_counter()
      state, acc = self._call(state, acc, program, inputs)
      if timed.sync:
        jax.block_until_ready(acc)
      timed.ended = time.perf_counter()
      timed.seconds, timed.compiled = timed.ended - begin, cache() > cached
      return state, acc

  def lower(self, state, acc, batch):
    return train_step.lower(self.task, state, metrics_lib.window(acc), batch)
