"""Loops that run the user's step, unrolled where XLA:CPU would run them slowly;
and :func:`branch`, a conditional that does not stop an NVIDIA GPU.

purax puts the user's step inside a loop in three places: ``k`` steps per call
(:func:`purax.plan` ``steps_per_call``), microbatch accumulation
(``Task(microbatches=k)``) and populations run a chunk of members at a time
(:mod:`purax.core.population`). Each builds its loop with :func:`scan` or
:func:`fori_loop` here, which unroll the loop fully when the body holds a
convolution and the backend is the CPU, and are ``jax.lax.scan`` /
``jax.lax.fori_loop`` otherwise.

Why: XLA:CPU runs a convolution through its fast (Eigen) kernel only when the
convolution is in NHWC / HWIO / NHWC form. Its ``ConvCanonicalization`` pass
(``xla/service/cpu/conv_canonicalization.cc``) rewrites the others into that
form, but it visits the entry computation only: a convolution inside a loop
body (``lax.scan``, ``fori_loop``, ``while_loop``) that is not already
canonical falls to a naive loop nest. Every weight gradient of a convolution
is such a one (``f01b_i01o->01bf``). Reported as jax-ml/jax#12868 (the
slowdown measured: ``benchmarks/README.md``, "Loops on XLA:CPU").

Unrolled, the loop's program holds the body ``length`` times: compilation
takes about ``length`` times as long (:func:`unrolls` lets a caller weigh
that), and the values are the same as the rolled loop's (each iteration is
the same computation).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

#: Primitives that XLA:CPU runs slowly inside a loop body (see the module doc).
SLOW_IN_CPU_LOOPS = frozenset({'conv_general_dilated'})


def _primitives(jaxpr) -> set[str]:
  names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for sub in jex_core.jaxprs_in_params(eqn.params):
      names |= _primitives(sub)
  return names


def unrolls(body: Callable, *args, platform: str | None = None) -> bool:
  """Whether a loop of ``body(*args)`` is unrolled: on the CPU, when ``body``
  (traced abstractly here, once more) holds a convolution.

  Args:
    body: the loop body.
    *args: its arguments (arrays, tracers or ``jax.ShapeDtypeStruct`` s).
    platform: ``'cpu'``, ``'gpu'``, ``'tpu'``; default ``jax.default_backend()``.
  """
  if (platform or jax.default_backend()) != 'cpu':
    return False
  return bool(_primitives(jax.make_jaxpr(body)(*args).jaxpr) & SLOW_IN_CPU_LOOPS)


def scan(body: Callable, init: Any, xs: Any, *, length: int | None = None):
  """``jax.lax.scan(body, init, xs)``, fully unrolled when :func:`unrolls`.

  ``xs`` leaves share a leading axis (or pass ``length`` with ``xs=None``).
  """
  first = jax.tree.map(lambda x: x[0], xs)
  return jax.lax.scan(body, init, xs, length=length, unroll=unrolls(body, init, first))


def fori_loop(lower: int, upper: int, body: Callable, init: Any):
  """``jax.lax.fori_loop(lower, upper, body, init)`` over static bounds, fully
  unrolled when :func:`unrolls` (``body(i, carry)``)."""
  unroll = unrolls(body, lower, init) and upper > lower
  return jax.lax.fori_loop(lower, upper, body, init, unroll=True if unroll else None)


#: Platforms on which :func:`branch` computes both branches and selects: XLA's
#: GPU runtime runs a conditional by copying the predicate to the host and
#: blocking the host until the device has finished all work queued before it
#: (``ConditionalThunk::ExecuteOnStream`` in
#: ``xla/backends/gpu/runtime/conditional_thunk.cc``: ``Memcpy``, then
#: ``BlockHostUntilDone``), so a ``lax.cond`` in a train step stops the host
#: from queueing the next step while this one runs.
SELECT_PLATFORMS = ('cuda', 'rocm')


def branch(pred, true_fn: Callable, false_fn: Callable, *operands):
  """``jax.lax.cond(pred, true_fn, false_fn, *operands)``, except on an NVIDIA
  or AMD GPU (:data:`SELECT_PLATFORMS`), where both branches are computed and
  each leaf of the result selected with ``jnp.where(pred, ...)``.

  The choice follows the platform the program is lowered for
  (``jax.lax.platform_dependent``), not the machine that traces it. On the
  CPU (and TPU) a conditional runs only the branch taken, and on the CPU it
  updates a large state in place where a select would copy it
  (``benchmarks/README.md``, "the guard's forms"); on a GPU the select fuses
  into the elementwise work that produces its operands, where a conditional
  would block the host. Both branches must return the same pytree structure,
  shapes and dtypes (as for ``lax.cond``).

  Args:
    pred: bool ``[]``.
    true_fn, false_fn: functions of ``*operands``.
    *operands: their arguments.

  Returns:
    ``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from purax.core import loops
    >>> f = jax.jit(lambda x: loops.branch(x.sum() > 0, lambda x: x - 1, lambda x: x, x))
    >>> f(jnp.ones(2)).tolist()
    [0.0, 0.0]
  """
  def cond(*ops):
    return jax.lax.cond(pred, true_fn, false_fn, *ops)

  def select(*ops):
    return jax.tree.map(lambda t, f: jnp.where(pred, t, f), true_fn(*ops), false_fn(*ops))

  return jax.lax.platform_dependent(*operands, default=cond,
                                    **{p: select for p in SELECT_PLATFORMS})


#: XLA:CPU compiler options for a program that holds unrolled steps: the
#: default scheduler keeps every unrolled step's temporaries live at once
#: (``benchmarks/README.md``, "The memory-optimized scheduler").
UNROLLED_CPU_OPTIONS = {'xla_cpu_scheduler_type': 'CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED'}


def _shape_dtype(x) -> tuple[tuple, Any, bool]:
  """``x``'s shape, dtype and weak type as jit sees them: numpy read directly
  (cheap: it is on the step's path), anything else by ``jax.typeof``."""
  if isinstance(x, (np.ndarray, np.generic)):
    return tuple(x.shape), jax.dtypes.canonicalize_dtype(x.dtype), False
  aval = jax.typeof(x)
  return tuple(aval.shape), aval.dtype, aval.weak_type


def abstract(x, *, drop_leading: bool = False) -> jax.ShapeDtypeStruct:
  """``x`` as ``jax.jit`` sees it: shape, dtype (canonical: float64 is float32
  without x64) and weak type (a Python number), for any leaf jit takes (jax
  or numpy arrays, Python scalars, ``ShapeDtypeStruct`` s); ``drop_leading``
  drops the first axis (a stack of batches)."""
  shape, dtype, weak = _shape_dtype(x)
  return jax.ShapeDtypeStruct(shape[1:] if drop_leading else shape, dtype, weak_type=weak)


def shapes_key(tree, *, drop_leading: bool = False) -> tuple:
  """A hashable key of ``tree``'s leaf ``(shape, dtype, weak_type)`` as jit
  sees them (:func:`abstract`); the dtype objects themselves (its name costs
  ~2 us per leaf to build, and the key is built on the step's path)."""
  key = []
  for x in jax.tree.leaves(tree):
    shape, dtype, weak = _shape_dtype(x)
    key.append((shape[1:] if drop_leading else shape, dtype, weak))
  return tuple(key)


_step_unrolls: dict = {}


def step_unrolls(task, batch, *, stacked: bool = False) -> bool:
  """Whether a loop of ``task.step`` over batches shaped like ``batch`` is
  unrolled (:func:`unrolls`); an abstract trace of the step, once per (task,
  batch shapes, backend); later calls only build the key. ``stacked``: every
  leaf of ``batch`` has a leading axis of batches (``[k, batch, ...]``),
  dropped."""
  key = (task, shapes_key(batch, drop_leading=stacked), jax.default_backend())
  if key not in _step_unrolls:
    shaped = jax.tree.map(lambda x: abstract(x, drop_leading=stacked), batch)
    _step_unrolls[key] = unrolls(task.step, task.abstract_state(shaped), shaped)
  return _step_unrolls[key]


class Jit:
  """``jax.jit(fn, **jit_kwargs)`` compiled with :data:`UNROLLED_CPU_OPTIONS`
  when ``unrolled(*args, **kwargs)`` says the program holds unrolled loops.

  Called, lowered (``.lower``) and counted (``._cache_size()``) like the jitted
  function; ``unrolled`` runs on the host at every call, so it must be cheap
  (a cached decision).
  """

  def __init__(self, fn: Callable, unrolled: Callable[..., bool], **jit_kwargs):
    self._plain = jax.jit(fn, **jit_kwargs)
    self._unrolled = jax.jit(fn, compiler_options=UNROLLED_CPU_OPTIONS, **jit_kwargs)
    self._pick = unrolled
    self.__wrapped__ = fn
    self.__doc__ = fn.__doc__

  def _for(self, *args, **kwargs):
    return self._unrolled if self._pick(*args, **kwargs) else self._plain

  def __call__(self, *args, **kwargs):
    return self._for(*args, **kwargs)(*args, **kwargs)

  def lower(self, *args, **kwargs):
    return self._for(*args, **kwargs).lower(*args, **kwargs)

  def _cache_size(self) -> int:
    return self._plain._cache_size() + self._unrolled._cache_size()
