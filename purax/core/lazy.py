"""Imports on first use: the one way purax defers an import.

``purax --help`` and an option error must not import jax (seconds on a busy
machine), so the modules the command-line parser reads import only the
standard library, tyro and each other:

- the package ``__init__`` s on its path (``purax``, ``purax.core``,
  ``purax.io``, ``purax.tune``) bind their public names on first access
  (:func:`attach`, PEP 562);
- the tables it reads name their rows' objects by import path
  (``'purax.nn.mlp:MLP'``, as entry points and pip's command table do),
  resolved on use (:func:`resolve`);
- a light module whose methods (not its definitions) need a heavy one names
  it at its top with :func:`module`
  (``precision_lib = lazy.module('purax.core.precision')``).

Once parsed, a command's module is resolved (:data:`purax.app.cli.RUN`) and
imports what it needs, as before: nothing is slower after parsing. This is
the only module that imports by name (``tests/app/test_config_and_tables.py``
holds that, and that no purax import sits inside a function);
``tests/test_layers.py`` reads the import paths, so the import direction
holds for them too, and checks that each names a module and its attribute.

Example:
  >>> from purax.core import lazy
  >>> lazy.resolve('purax.core.errors:ConfigError').__name__
  'ConfigError'
  >>> errors = lazy.module('purax.core.errors')   # imported at the first attribute
  >>> errors.ConfigError is lazy.resolve('purax.core.errors:ConfigError')
  True
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any, Callable, Mapping


def resolve(target: Any) -> Any:
  """The object an import path names: ``'package.module:attr'`` (an
  attribute, dotted for a nested one) or ``'package.module'`` (the module);
  anything that is not a string (a class, a function, None) is returned as is,
  so a table row may hold either.

  Raises:
    ImportError: the module cannot be imported (named by Python).
    AttributeError: the module has no such attribute.
  """
  if not isinstance(target, str):
    return target
  name, _, attr = target.partition(':')
  obj = importlib.import_module(name)
  for part in filter(None, attr.split('.')):
    obj = getattr(obj, part)
  return obj


class _Module:
  """A stand-in for module ``name`` that imports it at its first attribute access."""

  __slots__ = ('_name',)

  def __init__(self, name: str):
    self._name = name

  def __getattr__(self, attr: str) -> Any:
    return getattr(resolve(self._name), attr)

  def __dir__(self) -> list[str]:
    return dir(resolve(self._name))

  def __repr__(self) -> str:
    return f'<module {self._name!r}, imported on first use>'


def module(name: str) -> Any:
  """Module ``name``, imported at its first attribute access (then as fast as
  the module itself: one ``sys.modules`` lookup per access).

  For a light module whose methods, not its definitions, need a heavy one:
  ``precision = lazy.module('purax.core.precision')`` at the top, then
  ``precision.get_policy(spec)`` where it is used.
  """
  return _Module(name)


def attach(package: str, names: Mapping[str, str], deprecated: Mapping[str, tuple] = {}
           ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
  """``__getattr__`` and ``__dir__`` for a package whose public names are
  bound on first access (PEP 562)::

    __getattr__, __dir__ = lazy.attach(__name__, {'Task': 'purax.core.task:Task'})

  ``names`` maps each public name to its import path; ``dir(package)`` lists
  them. A name bound once is kept in the package (later accesses are plain
  lookups); a name outside the table that is a submodule (``purax.core.task``)
  is imported as one. ``deprecated`` maps an old spelling to ``(import path,
  new spelling, version it goes in)``: it still works, with a
  ``DeprecationWarning`` naming the replacement at each access, and is not
  listed by ``dir``.

  Raises:
    AttributeError: (from ``__getattr__``) neither a public name nor a submodule.
  """
  namespace = sys.modules[package].__dict__

  def __getattr__(name: str) -> Any:
    if name in names:
      value = namespace[name] = resolve(names[name])
      return value
    if name in deprecated:
      path, new, until = deprecated[name]
      warnings.warn(f'purax: {package}.{name} is deprecated: use {new} (it goes in {until}; '
                    'CHANGELOG.md)', DeprecationWarning, stacklevel=2)
      return resolve(path)
    try:
      return resolve(f'{package}.{name}')
    except ModuleNotFoundError as e:
      if e.name != f'{package}.{name}':
        raise
    raise AttributeError(f'module {package!r} has no attribute {name!r}')

  def __dir__() -> list[str]:
    return sorted({*namespace, *names})

  return __getattr__, __dir__
