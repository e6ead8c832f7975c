"""``steps_per_call='auto'``: how many steps one call of the jitted step runs.

The rule (:func:`choose_steps_per_call`) weighs the measured step time and
the second program's compilation against the run's length. The measurements
are explicit objects: each timed call is a :class:`Timed` input that the
plan's ``train_step`` fills in, and what this process has compiled is the
:data:`COMPILED` log. :func:`auto_batches` is the whole procedure for one
``fit``:

1. the first :data:`PROBE_STEPS` steps run one per call; the first call's
   host time is its compilation (when the jit's cache grew: recorded in
   :data:`COMPILED`), and one host sync after the last probe step gives the
   steps' time;
2. ``k`` is chosen by :func:`choose_steps_per_call` with the loop's cadence
   (``k`` divides it, so every hook's step is a call boundary);
3. the first two calls of ``k`` are timed: when the ``k``-step program is
   slower per step than the single one, the rest runs one step per call.

The result is the same whatever ``k`` (bitwise on the CPU), so the choice
never changes training.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Iterator

import jax

from purax.core import loops
from purax.plan.feed import own

#: Single steps timed before ``k`` is chosen (the first compiles).
PROBE_STEPS = 5

#: The share of the step time that ``k > 1`` steps per call is counted to save,
#: by platform (:func:`choose_steps_per_call`); measured by
#: ``benchmarks/step_overhead.py`` (``benchmarks/README.md``). Other platforms
#: count as accelerators.
MIN_GAIN = {'cpu': 0.1, 'accelerator': 0.5}


def choose_steps_per_call(step_s: float, compile_s: float, remaining: int | None,
                          cadence: int, *, call_s: float = 0.01, max_steps: int = 32,
                          min_gain: float | None = None, platform: str | None = None,
                          unrolled: bool = False) -> int:
  """The rule behind ``steps_per_call='auto'``: how many steps one call runs.

  ``k`` is the largest divisor of ``cadence`` (the loop's hook steps, so
  every such point is a call boundary) that is at most ``min(max_steps,
  ceil(call_s / step_s))``: one call then runs about ``call_s`` of work,
  against which the per-call cost (Python, the dispatch, one host-to-device
  transfer) is small, and at most ``max_steps`` batches are stacked on the
  device. ``k > 1`` compiles a second program (the scanned step), so it is
  chosen only when the run is long enough to pay for it: ``remaining * step_s
  * min_gain >= compile_s`` (``compile_s`` is ~0 when the programs are
  cached). An ``unrolled`` program (a step with convolutions on the CPU,
  :mod:`purax.core.loops`) holds the step ``k`` times and compiles about ``k``
  times as long: then the largest ``k`` that pays for ``k * compile_s`` is
  taken. With an unknown length (``remaining=None``) only the step time decides.

  Args:
    step_s: measured seconds per single step (after compilation).
    compile_s: the first call's extra seconds (its compilation; ~0 if cached).
    remaining: steps left in the run, or None.
    cadence: the gcd of the loop's cadences (> 0).
    call_s: seconds of work one call aims at.
    max_steps: the most steps one call runs.
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


@dataclasses.dataclass
class Timed:
  """A call's input (a batch or a :class:`purax.plan.Stacked`) whose host time
  the plan's ``train_step`` measures.

  Attributes:
    batch: the input itself.
    sync: wait for the call's result before the clock stops.
    seconds: the call's host time (set by the call).
    ended: ``time.perf_counter()`` when the call returned (set by the call).
    compiled: the call compiled its program (the jit's cache grew).
  """

  batch: Any
  sync: bool = False
  seconds: float | None = None
  ended: float | None = None
  compiled: bool = False


class CompileLog:
  """What this process compiled, by ``(task, batch shapes)``: the one-step
  program's compile seconds (timed at the first call of any ``fit``) and the
  ``k``-step programs built. ``'auto'`` weighs the second compilation with it:
  0 when the ``k``-step program exists, unknown (infinite) when the one-step
  program was compiled outside a timed call."""

  def __init__(self):
    self.one_step: dict[tuple, float] = {}
    self.multi: set[tuple] = set()

  def cost(self, key: tuple, k: int) -> float:
    return 0.0 if (*key, k) in self.multi else self.one_step.get(key, math.inf)


#: This process's :class:`CompileLog`.
COMPILED = CompileLog()


def k_pays(check: Timed, k: int, step_s: float) -> bool:
  """Whether a timed (synced) call of ``k`` steps ran at most as long per step
  as the probe's single steps (``step_s`` seconds each): else the rest of the
  run goes back to one step per call."""
  return check.seconds / k <= step_s


def timed_first(plan, calls: Iterator) -> Iterator:
  """``calls`` with the first one timed (no sync): its compile time is logged."""
  first = next(calls, None)
  if first is None:
    return
  batch, taken = first
  timed = Timed(batch)
  yield timed, taken
  if timed.compiled and taken == 1:
    COMPILED.one_step[(plan.task, loops.shapes_key(batch))] = timed.seconds
  yield from calls


def auto_batches(plan, host_batches: Iterator, loop) -> Iterator:
  """The calls of a ``steps_per_call='auto'`` fit (module docstring); the
  choice is left in ``plan.chosen_steps_per_call``."""
  # Held before their steps run: copied, as a loader may refill its arrays.
  probe = [own(b, loop.fresh_batches, held=True)
           for b in itertools.islice(host_batches, PROBE_STEPS)]
  timed = [Timed(b, sync=i == len(probe) - 1) for i, b in enumerate(probe)]
  yield from ((t, 1) for t in timed)
  k = 1
  if len(probe) == PROBE_STEPS:
    key = (plan.task, loops.shapes_key(probe[0]))
    if timed[0].compiled:
      COMPILED.one_step[key] = timed[0].seconds
    # Every probe step's run lies between the first call's return and the sync.
    step_s = (timed[-1].ended - timed[0].ended) / PROBE_STEPS
    remaining = None if loop.num_steps is None else loop.num_steps - loop.step
    cadence = loop.cadence or 1
    cost = COMPILED.cost(key, choose_steps_per_call(step_s, 0.0, None, cadence))
    k = choose_steps_per_call(step_s, cost, remaining, cadence)
    if k > 1 and cost > 0 and loops.step_unrolls(plan.task, probe[0]):   # k-fold compile
      k = choose_steps_per_call(step_s, cost, remaining, cadence, unrolled=True)
  plan.chosen_steps_per_call = k
  calls = plan.calls(host_batches, k, loop)
  if k == 1:
    yield from calls
    return
  checks = []
  for batch, taken in calls:
    if len(checks) < 2 and taken > 1:
      checks.append(Timed(batch, sync=True))
      yield checks[-1], taken
      if len(checks) == 2 and not k_pays(checks[1], k, step_s):
        plan.chosen_steps_per_call = 1   # slower than single steps: the rest runs singly
        yield from ((b, 1) for b in plan.singles(calls))
        return
    else:
      yield batch, taken
