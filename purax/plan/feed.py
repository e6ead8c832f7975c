"""Batch staging: how a host batch becomes a plan's step input.

A training batch goes from the loader to the jitted step through at most
four stages, each here once:

- copy (:func:`own`, :func:`owned`): the one "copy this batch?" decision
  (:func:`copy_needed`): a batch whose source may refill its arrays
  (a loader's ring of buffers) is copied where something could read it after
  the loader moved on: a batch held before its step runs, or any batch on the
  CPU (the jitted call, and ``jax.device_put``, may read a numpy array's
  memory after they return). A source that holds its batches
  (:func:`holds_its_batches`) is never copied;
- stack (:func:`stacked`, :class:`Stacked`): ``k`` batches into one
  ``[k, batch, ...]`` call of a multi-step program;
- prefetch (:func:`prefetch_to_device`): ``jax.device_put`` ahead of the step;
- transfer (:func:`to_step`, :func:`host_batch_transfer`): the batches as a
  plan's jitted call takes them, and the context the call runs in.

Nothing here compiles or steps; plans (:mod:`purax.plan`) call it.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from typing import Any, Iterable, Iterator

import jax
import numpy as np
from flax import struct

from purax.core import loops
from purax.core.errors import DataError, expect

try:   # the current (thread-local) host-to-device guard; read, never set, here
  from jax._src.config import transfer_guard_host_to_device as _H2D_GUARD
except ImportError:   # another jax layout: always enter the context
  _H2D_GUARD = None


# -- copy: the one decision ---------------------------------------------------


def holds_its_batches(data) -> bool:
  """Whether ``data``'s batches can be handed to a step as they are: a list or
  tuple of batches (held, so nothing refills them) or a source that builds new
  arrays at every read and says so (``fresh_batches = True``, as
  :func:`purax.io.pipeline.train_dataset` does). Other sources' batches are
  copied where :func:`copy_needed` says: a loader may refill its arrays."""
  return isinstance(data, (list, tuple)) or getattr(data, 'fresh_batches', False) is True


def copy_needed(fresh: bool, *, held: bool = False, platform: str | None = None) -> bool:
  """The one "copy this batch?" decision.

  Args:
    fresh: the batch is new arrays or held by its source
      (:func:`holds_its_batches`, or a copy made already): never copied.
    held: the batch is kept before its step runs (a probe, a replay).
    platform: ``'cpu'``, ``'gpu'``, ``'tpu'``; default ``jax.default_backend()``.

  Returns:
    True when a batch that is not ``fresh`` is ``held`` or lives on the CPU,
    where the jitted call and ``jax.device_put`` may read its memory after
    they return.
  """
  if fresh:
    return False
  return held or (platform or jax.default_backend()) == 'cpu'


def owned(batch):
  """``batch`` with each numpy array copied: memory that no loader writes again.

  On the CPU, ``jax.device_put`` and a jitted call may use an aligned numpy
  array's memory in place until the step reads it, and XLA runs the step
  after the call returns. A loader that refills the same array for its next
  batch (a ring of buffers, a preallocated batch) would then change a batch
  its step has not read yet, and training silently runs on other data
  (``tests/test_loop.py``: a loader that refills one 4096-byte-aligned batch
  trains differently without this copy). Costs one host copy of the batch;
  other leaves (jax arrays, Python scalars) are kept as they are.
  """
  return jax.tree.map(lambda x: np.array(x) if isinstance(x, np.ndarray) else x, batch)


def own(batch, fresh: bool = False, *, held: bool = False):
  """``batch``, copied (:func:`owned`) where :func:`copy_needed` says so."""
  return owned(batch) if copy_needed(fresh, held=held) else batch


# -- stack ----------------------------------------------------------------------


class Stacked(struct.PyTreeNode):
  """``k`` batches stacked for one multi-step call (every leaf ``[k, batch, ...]``)."""

  batches: Any

  @property
  def steps(self) -> int:
    return len(jax.tree.leaves(self.batches)[0])


def stacked(batches: Iterable, start: int, k: int, alone=lambda step: False, *,
            fresh: bool = False) -> Iterator:
  """Groups batches into :class:`Stacked` calls of ``k`` that end at multiples of
  ``k``; the steps before the first multiple (a resumed run), after the last (a
  tail shorter than ``k``) and every block of ``k`` holding a step that must
  run ``alone`` (a profiled step: ``alone(state.step)``) come as single
  batches, run by the one-step program: a shorter scan would be another
  compilation.

  Each batch is copied once, into its slot of the call's new ``[k, ...]``
  arrays, as it arrives (a loader may refill its arrays once it has yielded
  them); a single is staged by :func:`own` (``fresh``: the source's batches
  need no copy). What this yields needs no further copy.

  Raises:
    DataError: a batch of a call whose structure, shapes or dtypes (as jit
      sees them, :func:`purax.core.loops.shapes_key`) differ from the call's
      first batch's.
  """
  step, n = start, 0
  treedef = key = stacks = None
  single_until = start                 # steps before it run one per call
  for batch in batches:
    if not n and step % k == 0 and step >= single_until and any(
        alone(s) for s in range(step, step + k)):
      single_until = step + k
    if not n and (step % k or step < single_until):
      step += 1
      yield own(batch, fresh, held=True)
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


# -- prefetch and transfer ------------------------------------------------------


def prefetch_to_device(batches: Iterable, size: int = 2,
                       sharding: jax.sharding.Sharding | None = None, *,
                       fresh: bool = False) -> Iterator:
  """Yields batches already put on the device, ``size`` ahead of the consumer.

  ``jax.device_put`` is asynchronous, so the next batch is transferred while
  the current step runs (the idea of ``flax.jax_utils.prefetch_to_device``,
  for any sharding). Each batch is staged by :func:`own` first (on the CPU
  ``device_put`` may keep using a numpy array's memory; ``fresh``: no copy).
  """
  queue = collections.deque()
  iterator = iter(batches)

  def enqueue(n):
    for batch in itertools.islice(iterator, n):
      queue.append(jax.device_put(own(batch, fresh), sharding))

  enqueue(size)
  while queue:
    yield queue.popleft()
    enqueue(1)


def host_batch_transfer():
  """The context a plan calls its jitted step in: the host-to-device copy of a
  numpy batch (:func:`to_step`) is allowed, as an explicit ``jax.device_put``
  would be, whatever transfer guard the caller set. The step's other
  arguments (state, metrics) are already on the device. Without a guard set
  (the usual case) nothing is entered: the context costs a few microseconds
  per step."""
  if _H2D_GUARD is not None and _H2D_GUARD.value in (None, 'allow'):
    return contextlib.nullcontext()
  return jax.transfer_guard_host_to_device('allow')


def to_step(batches: Iterable, prefetch: int, sharding=None, *, copied: bool = False
            ) -> Iterator:
  """Host batches as a plan's jitted step takes them.

  With a ``sharding``, or on an accelerator: put on the device ``prefetch``
  ahead (:func:`prefetch_to_device`), so each transfer overlaps the step
  before it. On the CPU without one: numpy, each batch staged by :func:`own`
  (a private copy unless ``copied``), handed to the jitted call as it is: a
  CPU "device" has no transfer to overlap, and ``jax.device_put`` ahead of
  the call is host work the step waits for (``benchmarks/README.md``). The
  call's transfer is made under :func:`host_batch_transfer`. ``copied``: the
  batches are private copies already, or new arrays (not copied again).
  """
  if sharding is None and jax.default_backend() == 'cpu':
    return (own(b, copied) for b in batches)
  return prefetch_to_device(batches, prefetch, sharding, fresh=copied)
