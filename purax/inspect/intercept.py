"""Module calls, intercepted: what :func:`purax.inspect.nan.find` uses to
see every layer's output inside a traced step, for any model adapter.

:func:`intercept_calls` installs a hook in the adapters' one seam
(:func:`purax.core.model.intercepted`): a linen ``apply`` runs under
:func:`linen_calls` (flax.linen's own ``intercept_methods``), NNX and Equinox
modules under :func:`patched_calls` (their classes' ``__call__`` wrapped while
the model is traced; a copy of a module made inside the trace, as a scan over
stacked layers makes one per iteration, takes the path of the one module of its
class). With no hook installed the seam is a null context:
nothing is traced differently.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

import flax.linen as nn

from purax.core.model import INTERCEPTOR


class _Interceptor:
  """What :data:`purax.core.model.INTERCEPTOR` holds while a hook is installed."""

  def __init__(self, hook: Callable):
    self.hook = hook

  def linen(self):
    return _linen(self.hook)

  def patched(self, modules):
    return _patched(self.hook, modules)


@contextlib.contextmanager
def intercept_calls(hook: Callable):
  """While inside, the adapters hand every module call their ``apply`` makes to
  ``hook(path, method, call, args, kwargs)``, which returns the outputs
  (``call(*args, **kwargs)``, or anything in their place): linen through
  ``flax.linen.intercept_methods`` (every public method), NNX and Equinox
  modules by their ``__call__``. ``path`` is the module's path in the model
  (a tuple; ``()`` the model itself). Acts at trace time only: a program
  traced outside it is unchanged. Used by :func:`purax.inspect.nan.find`.
  """
  token = INTERCEPTOR.set(_Interceptor(hook))
  try:
    yield
  finally:
    INTERCEPTOR.reset(token)


def active() -> bool:
  """Whether an :func:`intercept_calls` hook is installed (trace time)."""
  return INTERCEPTOR.get() is not None


def linen_calls():
  """``flax.linen.intercept_methods`` of the active hook, or a null context."""
  interceptor = INTERCEPTOR.get()
  return contextlib.nullcontext() if interceptor is None else interceptor.linen()


def patched_calls(modules):
  """For NNX and Equinox models: while inside, a call of one of ``modules``
  (``(path, module)`` pairs) goes to the active :func:`intercept_calls` hook;
  their classes' ``__call__`` are wrapped for the time (a trace) and restored."""
  interceptor = INTERCEPTOR.get()
  return contextlib.nullcontext() if interceptor is None else interceptor.patched(modules)


def _linen(hook):
  def interceptor(call, args, kwargs, context):
    name = context.method_name
    if name == 'setup' or (name.startswith('_') and name != '__call__'):
      return call(*args, **kwargs)
    return hook(tuple(context.module.path), context.method_name, call, args, kwargs)
  return nn.intercept_methods(interceptor)


@contextlib.contextmanager
def _patched(hook, modules):
  modules = list(modules)
  if not modules:
    yield
    return
  paths = {id(m): tuple(p) for p, m in modules}
  classes = {type(m): (type(m).__call__, type(m).__dict__.get('__call__'))
             for _, m in modules}
  by_class: dict[type, list[tuple]] = {}
  for p, m in modules:
    by_class.setdefault(type(m), []).append(tuple(p))

  def wrapped(original):
    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
      path = paths.get(id(self))
      if path is None:
        # A module made while tracing: the per-iteration copy of a stacked
        # (scanned, vmapped) layer that jax.lax.scan / nnx.scan rebuild from
        # its arrays. Named by the one module of its class in the model, if
        # there is one; else not intercepted.
        known = by_class.get(type(self), ())
        path = known[0] if len(known) == 1 else None
      if path is None:
        return original(self, *args, **kwargs)
      return hook(path, '__call__', functools.partial(original, self), args, kwargs)
    return __call__

  try:
    for cls, (original, _) in classes.items():
      type.__setattr__(cls, '__call__', wrapped(original))
    yield
  finally:
    for cls, (_, own) in classes.items():
      if own is None:
        type.__delattr__(cls, '__call__')
      else:
        type.__setattr__(cls, '__call__', own)
