"""Seconds this thread has spent tracing, lowering and compiling jax programs.

jax reports each phase of a compilation as a ``jax.monitoring`` time span
(``/jax/core/compile/jaxpr_trace_duration``, ``.../jaxpr_to_mlir_module_duration``,
``.../backend_compile_duration``; a load from the persistent compilation cache
is inside the last). One listener, registered when this module is imported,
adds up the union of those spans per thread (a jitted function traced inside
another's trace is counted once), so :func:`seconds` read before and after a
stretch of work says how much of it was compilation. :class:`purax.hooks.Log`
leaves it out of ``steps_per_sec`` and writes it as ``compile_s``.

Example:
  >>> from purax.io import compile_time
  >>> double = jax.jit(lambda v: 2 * v)
  >>> before = compile_time.seconds()
  >>> _ = double(jnp.ones(3))                  # the first call compiles
  >>> compile_time.seconds() > before
  True
  >>> before = compile_time.seconds()
  >>> _ = double(jnp.ones(3))                  # then runs the program it has
  >>> compile_time.seconds() - before
  0.0
"""

from __future__ import annotations

import threading

import jax

#: The jax.monitoring events of a compilation's phases.
EVENTS = frozenset(('/jax/core/compile/jaxpr_trace_duration',
                    '/jax/core/compile/jaxpr_to_mlir_module_duration',
                    '/jax/core/compile/backend_compile_duration'))

#: The merged spans kept per thread (older ones cannot overlap a new compilation's).
_KEEP = 64

_local = threading.local()


def seconds() -> float:
  """The calling thread's compilation seconds since this module was imported."""
  return getattr(_local, 'total', 0.0)


def _record(event: str, start: float, end: float, **kwargs) -> None:
  """Adds ``[start, end]`` to this thread's union of compilation spans."""
  del kwargs
  if event not in EVENTS:
    return
  spans = getattr(_local, 'spans', None)
  if spans is None:
    spans = _local.spans = []
  total = seconds()
  # Spans end in order (an inner trace ends before the outer one): merge the
  # ones the new span overlaps, and count what it adds.
  while spans and spans[-1][1] >= start:
    s, e = spans.pop()
    total -= e - s
    start, end = min(start, s), max(end, e)
  spans.append((start, end))
  _local.total = total + (end - start)
  del spans[:-_KEEP]


jax.monitoring.register_event_time_span_listener(_record)
