"""Loops that run the user's step: unrolled where XLA:CPU would run them slowly.

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
is such a one (``f01b_i01o->01bf``). Reported as jax-ml/jax#12868. Measured
with :class:`purax.nn.CNN` on digits (batch 64, the 2-core CPU, jax 0.10.2),
looped against unrolled: 16 steps per call 12x slower per step, 4
microbatches 5.6x, a population of 8 one member at a time 12x slower than 8
separate runs.

Unrolled, the loop's program holds the body ``length`` times: compilation
takes about ``length`` times as long (:func:`unrolls` lets a caller weigh
that), and the values are the same as the rolled loop's (each iteration is
the same computation).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
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
