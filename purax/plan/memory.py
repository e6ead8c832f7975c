"""Fit a train step in memory: compile candidate configurations, keep the fastest that fits.

:func:`fit_memory` answers "the step runs out of memory" without running a
step. It varies what changes a step's memory but not what it computes —

- the remat policy of the model's blocks (a model with a ``remat`` field:
  :mod:`purax.nn.remat`; it changes memory, not values);
- gradient accumulation over microbatches, the global batch kept
  (``Task.microbatches``; the same update up to float summation order);
- FSDP over the mesh's batch axes (:func:`purax.parallel.fsdp` instead of
  :func:`purax.parallel.data_parallel`; with a ``mesh``);
- and, only where the caller allows it, the precision policy
  (:mod:`purax.core.precision`; that one changes the values) —

lowers and compiles the train step of each candidate as a run would
(:meth:`purax.plan.Plan.lower`), reads XLA's memory analysis of the compiled
program (arguments + outputs - donated and aliased + temporaries: the
``peak_bytes`` of :func:`purax.inspect.summary.compiled_cost`, per device) and
its cost analysis, and keeps the candidate of least estimated step cost whose
peak fits the budget.

The speed estimate comes from XLA's cost analysis of the same compiled
programs: the candidate with the fewest FLOPs wins (remat recomputes,
microbatches add accumulation), and among those within
:data:`FLOPS_TOLERANCE` of the fewest (a precision, FSDP, a remat policy the
compiler made free), the one with the fewest bytes accessed. XLA counts a
loop body once (``lax.scan``: scanned layers, microbatches), not once per
iteration, so a candidate with ``k`` microbatches in a rolled loop is counted
``k`` times (the loop holds the forward and backward passes, nearly all of
the step; the optimizer update counted ``k`` times too makes the estimate a
little high, so ties go to fewer microbatches). Scanned layers are counted
once in every candidate of a model alike.

Candidates are tried from the least to the most memory-saving; one that is at
least as saving as a candidate that already fits on every axis (the same
precision) is not compiled: it does more work (recomputation, more
microbatches, gathers) for memory it does not need. So a roomy budget
compiles one program per precision, and only a budget that nothing meets
compiles them all.

Defaults and limits:

- The budget (``budget_bytes``) defaults to the device's memory limit
  (``jax.Device.memory_stats()['bytes_limit']``) less
  :data:`purax.plan.budget.MARGIN`, for the batches prefetched to the device
  and the allocator's fragmentation; a CPU reports no limit, and then the
  host's available memory less the margin is used, and said.
- The step measured is the one-step program; ``steps_per_call > 1`` stacks
  batches and needs more.
- Microbatches change what a model with batch statistics computes
  (BatchNorm normalises each microbatch by its own statistics), and are not
  allowed for a loss that couples examples: for such tasks the default
  candidates keep one microbatch; name them explicitly to allow them.

Example: fit, then train the configuration chosen with its plan:

  >>> task = purax.Task(model=purax.nn.CNN(num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
  >>> fit = purax.plan.fit_memory(task, batch, budget_bytes=2**30, quiet=True)
  >>> str(fit.chosen)                  # the task as given fits
  'microbatches=1'
  >>> state = fit.task.init(jax.random.key(0), batch)
  >>> state, history = purax.fit(fit.task, state, batches, steps=2, plan=fit.plan(batch))
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import numbers
import sys
from typing import Any, Callable, Iterator, Mapping, Sequence, TextIO

import jax
from jax.sharding import Mesh

from purax import parallel
from purax.core import lazy
from purax.core import loops
from purax.core.errors import ConfigError, OutOfMemoryError, expect, expect_kind
from purax.core.task import Task
from purax.io.checkpoint.run import abstract_checkpoint
from purax.io.profile import is_out_of_memory
from purax.plan.budget import MARGIN, default_budget
from purax.plan.candidates import Candidate, axes, dominates, grid
from purax.plan.sharded import sharded
from purax.plan.single import SingleDevicePlan

# Inspection is off the step's path (tests/inspect/test_moved.py): imported on use.
summary_lib = lazy.module('purax.inspect.summary')

#: Candidates whose estimated FLOPs are within this share of the fewest are
#: ranked by bytes accessed.
FLOPS_TOLERANCE = 0.01


@dataclasses.dataclass(frozen=True)
class Row:
  """A line of the candidate table.

  Attributes:
    candidate: the configuration.
    cost: :func:`purax.inspect.summary.compiled_cost` of its compiled step (per
      device; ``peak_bytes``, ``flops``, ``bytes_accessed``, ...), or None:
      not compiled (``note`` says why).
    loop_trips: the times XLA's count of the step's loop body is taken (the
      microbatches of a rolled accumulation loop; module doc).
    fits: ``peak_bytes <= budget``; None when not compiled.
    note: why it was not compiled, or what failed.
  """

  candidate: Candidate
  cost: Mapping[str, float] | None = None
  loop_trips: int = 1
  fits: bool | None = None
  note: str = ''

  @property
  def peak_bytes(self) -> float | None:
    return None if self.cost is None else self.cost.get('peak_bytes')

  @property
  def flops(self) -> float | None:
    """Estimated FLOPs of one step (XLA's count times ``loop_trips``)."""
    if self.cost is None or 'flops' not in self.cost:
      return None
    return self.loop_trips * self.cost['flops']

  @property
  def bytes_accessed(self) -> float | None:
    """Estimated bytes accessed by one step (as :attr:`flops`)."""
    if self.cost is None or 'bytes_accessed' not in self.cost:
      return None
    return self.loop_trips * self.cost['bytes_accessed']


@dataclasses.dataclass(frozen=True)
class MemoryFit:
  """What :func:`fit_memory` chose.

  Attributes:
    chosen: the :class:`Candidate` kept.
    task: the task in that configuration (:meth:`Candidate.task`).
    mesh: the mesh it runs on (None: one device).
    budget_bytes: the budget per device.
    budget_source: where the budget came from, in words.
    rows: every candidate, in the order tried, with what was measured.
  """

  chosen: Candidate
  task: Task
  mesh: Mesh | None
  budget_bytes: int
  budget_source: str
  rows: tuple[Row, ...]

  @property
  def row(self) -> Row:
    """The chosen candidate's :class:`Row`."""
    return next(r for r in self.rows if r.candidate == self.chosen)

  def plan(self, sample_batch):
    """The plan that runs ``task``: :class:`purax.plan.SingleDevicePlan`,
    or :func:`purax.parallel.sharded` on ``mesh`` with the rules its shape
    implies (:func:`purax.parallel.for_mesh`)."""
    if self.mesh is None:
      return SingleDevicePlan(self.task)
    return sharded(self.task, self.mesh, parallel.for_mesh(self.mesh), sample_batch)

  def table(self) -> str:
    """The candidate table and the choice, as :func:`fit_memory` prints it."""
    return format_table(self.rows, self.budget_bytes, self.budget_source, self.chosen)


# -- measuring one ---------------------------------------------------------------------------

#: Compiled costs by (task, batch shapes, mesh): a candidate measured once per
#: process (the command line's dry run and run, repeated budgets).
_MEASURED: collections.OrderedDict = collections.OrderedDict()
_MEASURED_MAX = 64


def measure(task: Task, batch, mesh: Mesh | None = None) -> dict[str, float]:
  """:func:`purax.inspect.summary.compiled_cost` of ``task``'s train step as the
  plan of a run lowers it (one device, or ``mesh`` with
  :func:`purax.parallel.for_mesh`'s rules): compiled, never run.

  Raises:
    ConfigError, DataError: the task refuses the batch or the configuration.
  """
  shapes = jax.tree.map(loops.abstract, batch)
  key = (task, loops.shapes_key(shapes), mesh)
  if key in _MEASURED:
    _MEASURED.move_to_end(key)
    return _MEASURED[key]
  abstract = abstract_checkpoint(task, shapes)
  if mesh is None:
    plan = SingleDevicePlan(task)
  else:
    plan = sharded(task, mesh, parallel.for_mesh(mesh), shapes)
  compiled = plan.lower(abstract['state'], abstract['train_metrics'], shapes).compile()
  cost = summary_lib.compiled_cost(compiled)
  _MEASURED[key] = cost
  while len(_MEASURED) > _MEASURED_MAX:
    _MEASURED.popitem(last=False)
  return cost


def fastest(rows: Sequence[Row]) -> Row:
  """The row of least estimated step cost (module doc): fewest FLOPs, then,
  within :data:`FLOPS_TOLERANCE` of them, fewest bytes accessed; rows
  without counts only when no row has them, the first of them."""
  counted = [r for r in rows if r.flops is not None]
  if not counted:
    return rows[0]
  least = min(r.flops for r in counted)
  near = [r for r in counted if r.flops <= least * (1 + FLOPS_TOLERANCE)]
  return min(near, key=lambda r: (r.bytes_accessed is None, r.bytes_accessed or 0.0, r.flops))


# -- fitting ---------------------------------------------------------------------------------


def fit_memory(task: Task, batch, *, mesh: Mesh | None = None, budget_bytes: int | None = None,
               remat: Sequence[str] | None = None, microbatches: Sequence[int] | None = None,
               precision: Sequence[str] | None = None,
               stream: TextIO | None = None, quiet: bool = False) -> MemoryFit:
  """The fastest configuration of ``task``'s step that fits ``budget_bytes``.

  Compiles candidates (module doc), never runs a step; prints the table of
  candidates (fits?, peak bytes per device, estimated step cost) and the
  choice to ``stream``.

  Args:
    task: the task as the run would use it (its model, microbatches,
      precision: the first candidate when they are among the choices).
    batch: a global batch (``{'x': [batch, ...], ...}``; arrays or
      ``jax.ShapeDtypeStruct``): only its shapes and dtypes matter.
    mesh: a :func:`purax.parallel.make_mesh` mesh: candidates are data
      parallel and FSDP over its batch axes (``data`` x ``fsdp``); None: one device.
    budget_bytes: bytes per device the step may use; default the device's
      memory less a margin (:func:`purax.plan.budget.default_budget`).
    remat: remat policies to try, least saving first; default
      :data:`purax.plan.candidates.REMAT` for a model with a ``remat`` field.
    microbatches: counts to try; default those of
      :data:`purax.plan.candidates.MICROBATCHES` that
      divide the batch (one for a model with batch statistics or a loss that
      couples examples: the module doc).
    precision: policies the caller allows (``('fp32', 'bf16')``); default
      only the model's own.
    stream: where the table goes (default ``sys.stdout``).
    quiet: print nothing.

  Returns:
    A :class:`MemoryFit`: the chosen candidate, its task and mesh, the table.

  Raises:
    OutOfMemoryError: no candidate fits; the message names the smallest.
    ConfigError: a bad budget or a choice the task cannot take
      (:func:`purax.plan.candidates.candidates`).

  Example: a budget below the step's peak, met by two microbatches:

    >>> from purax.plan import fit_memory
    >>> task = purax.Task(model=purax.nn.CNN(num_classes=10),
    ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
    >>> peak = fit_memory(task, batch, budget_bytes=2**30, quiet=True).row.peak_bytes
    >>> fit = fit_memory(task, batch, budget_bytes=int(0.8 * peak))
    fit_memory: budget ... per device (given)
    candidate       fits        peak  est. GFLOP  est. accessed
    microbatches=1    no ...
    microbatches=2   yes ...
    microbatches=4     -  not compiled: microbatches=2 fits with less work
    microbatches=8     -  not compiled: microbatches=2 fits with less work
    chose: microbatches=2 (...)
    >>> fit.task.microbatches
    2
  """
  expect_kind(task, 'task', Task, 'a purax.Task')
  expect(mesh is None or isinstance(mesh, Mesh), 'mesh', 'None or a jax.sharding.Mesh',
         type(mesh).__name__, ConfigError)
  if budget_bytes is None:
    budget_bytes, source = default_budget()
  else:
    expect_kind(budget_bytes, 'budget_bytes', numbers.Real, 'a number of bytes >= 1')
    expect(math.isfinite(budget_bytes) and budget_bytes >= 1, 'budget_bytes',
           'a finite number of bytes >= 1', budget_bytes, ConfigError)
    budget_bytes, source = int(budget_bytes), 'given'
  policies, ks, fsdp, precisions = axes(task, batch, mesh, remat, microbatches, precision)
  tried = grid(policies, ks, fsdp, precisions)
  rolled = None     # whether a microbatch loop stays a loop (loops.step_unrolls)
  rows: list[Row] = []
  for c in tried:
    fitting = [r.candidate for r in rows if r.fits]
    covered = next((d for d in fitting if dominates(c, d, policies, ks)), None)
    if covered is not None:
      rows.append(Row(c, note=f'not compiled: {covered} fits with less work'))
      continue
    candidate_task = c.task(task)
    try:
      cost = measure(candidate_task, batch, c.mesh(mesh))
    except jax.errors.JaxRuntimeError as e:   # a compiler that itself runs out of memory
      if not is_out_of_memory(e):
        raise
      rows.append(Row(c, fits=False, note='the compiler ran out of memory'))
      continue
    trips = 1
    if c.microbatches > 1:
      if rolled is None:
        rolled = not loops.step_unrolls(task, batch)
      trips = c.microbatches if rolled else 1
    rows.append(Row(c, cost, trips, cost['peak_bytes'] <= budget_bytes))
  fitting = [r for r in rows if r.fits]
  if not fitting:
    if not quiet:
      print(format_table(rows, budget_bytes, source, None), file=stream or sys.stdout)
    smallest = min((r for r in rows if r.peak_bytes is not None), key=lambda r: r.peak_bytes,
                   default=None)
    need = ('none compiled' if smallest is None else
            f'the smallest, {smallest.candidate}, needs '
            f'{summary_lib.human_bytes(smallest.peak_bytes)}')
    raise OutOfMemoryError(
        f'budget_bytes: expected a configuration whose step fits '
        f'{summary_lib.human_bytes(budget_bytes)} per device ({source}), got none of '
        f'{len(rows)} candidates ({need}; allow more: remat, microbatches, precision, a '
        'mesh with more devices, or a smaller batch)')
  best = fastest(fitting)
  fit = MemoryFit(best.candidate, best.candidate.task(task), best.candidate.mesh(mesh),
                  budget_bytes, source, tuple(rows))
  if not quiet:
    print(fit.table(), file=stream or sys.stdout)
  return fit


def format_table(rows: Sequence[Row], budget_bytes: int, source: str,
                 chosen: Candidate | None) -> str:
  """The table :func:`fit_memory` prints: one line per candidate, then the choice."""
  human = summary_lib.human_bytes
  width = max(len('candidate'), *(len(str(r.candidate)) for r in rows))
  lines = [f'fit_memory: budget {human(budget_bytes)} per device ({source})',
           f"{'candidate':<{width}}  {'fits':>4}  {'peak':>10}  {'est. GFLOP':>10}  "
           f"{'est. accessed':>13}"]
  for r in rows:
    if r.cost is None:
      lines.append(f"{str(r.candidate):<{width}}  {'-':>4}  {r.note}")
      continue
    flops = '?' if r.flops is None else f'{r.flops / 1e9:.4g}'
    accessed = '?' if r.bytes_accessed is None else human(r.bytes_accessed)
    lines.append(f"{str(r.candidate):<{width}}  {'yes' if r.fits else 'no':>4}  "
                 f"{human(r.peak_bytes):>10}  {flops:>10}  {accessed:>13}"
                 + (f'  {r.note}' if r.note else ''))
  if chosen is None:
    lines.append('chose: nothing fits')
  else:
    row = next(r for r in rows if r.candidate == chosen)
    lines.append(f'chose: {chosen} ({human(row.peak_bytes)} of {human(budget_bytes)}; of the '
                 'candidates that fit, the fewest estimated FLOPs, then bytes accessed)')
  return '\n'.join(lines)


# -- a step that ran out of memory -----------------------------------------------------------


@contextlib.contextmanager
def explain_out_of_memory(task: Task, batch, *, mesh: Mesh | None = None,
                          budget_bytes: int | None = None,
                          spell: Callable[[Candidate], str] = str,
                          **choices: Any) -> Iterator[None]:
  """Turns XLA's ``RESOURCE_EXHAUSTED`` inside into an :class:`OutOfMemoryError`
  that names the configurations of ``task`` that would fit (:func:`fit_memory`
  with ``choices``: ``remat=``, ``microbatches=``, ``precision=``; compiled
  after the failure, nothing run). Other errors pass unchanged.

  Args:
    task, batch, mesh, budget_bytes: as :func:`fit_memory` (the budget:
      default the device's memory less the margin).
    spell: how a candidate is named (the command line spells its flags).

  Example: a run whose step fits says nothing; one that runs out of memory
  raises what :func:`out_of_memory_message` says for its budget:

    >>> from purax.plan.memory import explain_out_of_memory, out_of_memory_message
    >>> task = purax.Task(model=purax.nn.CNN(num_classes=10),
    ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
    >>> state = task.init(jax.random.key(0), batch)
    >>> with explain_out_of_memory(task, batch):
    ...   state, history = purax.fit(task, state, batches, steps=2)
    >>> peak = purax.plan.memory.measure(task, batch)['peak_bytes']
    >>> print(out_of_memory_message(task, batch, budget_bytes=int(0.8 * peak)))
    step: expected to fit the device memory, got RESOURCE_EXHAUSTED; configurations that
    fit ... per device (given), fastest first: microbatches=2 (...)
  """
  try:
    yield
  except jax.errors.JaxRuntimeError as e:
    if not is_out_of_memory(e):
      raise
    raise OutOfMemoryError(out_of_memory_message(task, batch, mesh=mesh,
                                                 budget_bytes=budget_bytes, spell=spell,
                                                 **choices)) from e


def out_of_memory_message(task: Task, batch, *, mesh=None, budget_bytes=None, spell=str,
                          **choices) -> str:
  """The message of :func:`explain_out_of_memory`: the fitting candidates,
  fastest first, or why none could be found.

  Without ``budget_bytes`` the budget is the device's
  (:func:`purax.plan.budget.default_budget`), and below the compiled peak of
  the step that failed less the margin: that much did not fit."""
  head = 'step: expected to fit the device memory, got RESOURCE_EXHAUSTED'
  human = summary_lib.human_bytes
  try:
    if budget_bytes is None:
      budget_bytes, source, _ = budget_below_failure(task, batch, mesh=mesh)
    else:
      source = 'given'
    fit = fit_memory(task, batch, mesh=mesh, budget_bytes=budget_bytes, quiet=True,
                     **choices)
  except OutOfMemoryError as e:
    return f'{head}; no configuration found that fits: {e}'
  fitting = sorted((r for r in fit.rows if r.fits),
                   key=lambda r: (r.flops is None, r.flops or 0.0, r.bytes_accessed or 0.0))
  named = '; '.join(f'{spell(r.candidate)} ({human(r.peak_bytes)})' for r in fitting)
  return (f'{head}; configurations that fit {human(budget_bytes)} per device ({source}), '
          f'fastest first: {named}')


def budget_below_failure(task: Task, batch, *, mesh: Mesh | None = None,
                         budget_bytes: int | None = None) -> tuple[int, str, int | None]:
  """``(bytes, words, failed)``: the budget per device for a step that ran
  out of memory to be fitted again: ``budget_bytes`` (default the device's,
  :func:`purax.plan.budget.default_budget`), and at most the compiled peak of
  the step that failed (``failed``, bytes; :func:`measure`) less
  :data:`MARGIN`: that much did not fit. ``words`` says which bound holds.

  Raises:
    ConfigError: no budget given and the device reports none.
  """
  if budget_bytes is None:
    budget_bytes, words = default_budget()
  else:
    words = 'given'
  failed = measure(task, batch, mesh).get('peak_bytes')
  if failed and failed * (1 - MARGIN) < budget_bytes:
    budget_bytes = int(failed * (1 - MARGIN))
    words = f'{1 - MARGIN:.0%} of the {summary_lib.human_bytes(failed)} of the step that failed'
  return int(budget_bytes), words, (int(failed) if failed else None)
