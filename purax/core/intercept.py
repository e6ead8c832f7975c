"""Module calls, intercepted: what :func:`purax.core.nonfinite.find` uses to
see every layer's output inside a traced step, for any model adapter.

:func:`intercept_calls` installs a hook; the adapters of
:mod:`purax.core.model` (and :mod:`purax.nn.equinox`) route their module
calls through it with :func:`linen_calls` (flax.linen's own
``intercept_methods``) or :func:`patched_calls` (NNX and Equinox modules,
whose classes' ``__call__`` are wrapped while the model is traced). With no
hook installed both are null contexts: nothing is traced differently.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Callable

import flax.linen as nn

#: ``hook(path, method, call, args, kwargs) -> outputs`` while
#: :func:`intercept_calls` is active, else None.
_CALL_HOOK: contextvars.ContextVar = contextvars.ContextVar('purax_call_hook', default=None)


@contextlib.contextmanager
def intercept_calls(hook: Callable):
  """While inside, the adapters hand every module call their ``apply`` makes to
  ``hook(path, method, call, args, kwargs)``, which returns the outputs
  (``call(*args, **kwargs)``, or anything in their place): linen through
  ``flax.linen.intercept_methods`` (every public method), NNX and Equinox
  modules by their ``__call__``. ``path`` is the module's path in the model
  (a tuple; ``()`` the model itself). Acts at trace time only: a program
  traced outside it is unchanged. Used by :func:`purax.core.nonfinite.find`.
  """
  token = _CALL_HOOK.set(hook)
  try:
    yield
  finally:
    _CALL_HOOK.reset(token)


def linen_calls():
  """``flax.linen.intercept_methods`` of the active hook, or a null context."""
  hook = _CALL_HOOK.get()
  if hook is None:
    return contextlib.nullcontext()

  def interceptor(call, args, kwargs, context):
    name = context.method_name
    if name == 'setup' or (name.startswith('_') and name != '__call__'):
      return call(*args, **kwargs)
    return hook(tuple(context.module.path), context.method_name, call, args, kwargs)
  return nn.intercept_methods(interceptor)


@contextlib.contextmanager
def patched_calls(modules):
  """For NNX and Equinox models: while inside, a call of one of ``modules``
  (``(path, module)`` pairs) goes to the active :func:`intercept_calls` hook;
  their classes' ``__call__`` are wrapped for the time (a trace) and restored."""
  hook = _CALL_HOOK.get()
  modules = list(modules)
  if hook is None or not modules:
    yield
    return
  paths = {id(m): tuple(p) for p, m in modules}
  classes = {type(m): (type(m).__call__, type(m).__dict__.get('__call__'))
             for _, m in modules}

  def wrapped(original):
    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
      path = paths.get(id(self))
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




def active() -> bool:
  """Whether an :func:`intercept_calls` hook is installed (trace time)."""
  return _CALL_HOOK.get() is not None
