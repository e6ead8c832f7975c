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

The user's own code named on the command line (``--model mypkg.nets:make_net``,
``--loss``, ``--dataset``) is imported here too, after parsing, by
:func:`user`: each way it can fail is a :class:`~purax.core.errors.ConfigError`
naming the option, what was expected and what was found.

Example:
  >>> from purax.core import lazy
  >>> lazy.resolve('purax.core.errors:ConfigError').__name__
  'ConfigError'
  >>> errors = lazy.module('purax.core.errors')   # imported at the first attribute
  >>> errors.ConfigError is lazy.resolve('purax.core.errors:ConfigError')
  True
"""

from __future__ import annotations

import difflib
import importlib
import importlib.abc
import importlib.util
import os
import re
import sys
import warnings
from typing import Any, Callable, Mapping

from purax.core.errors import ConfigError


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


#: A user's import path: ``module.path:name`` (dotted identifiers on either side).
IMPORT_PATH = re.compile(r'[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*')


def is_import_path(text: Any) -> bool:
  """Whether ``text`` has the form ``module.path:name`` (nothing is imported)."""
  return isinstance(text, str) and IMPORT_PATH.fullmatch(text) is not None


def path_hint(text: str) -> str:
  """`` (did you mean 'a.b:c'?)`` for a dotted ``'a.b.c'`` without ``':'``, else ``''``."""
  meant = ':'.join(text.rsplit('.', 1))
  return f' (did you mean {meant!r}?)' if ':' not in text and is_import_path(meant) else ''


def expected_path(field: str, text: str, names: Any = (), what: str = 'NAME',
                  example: str = 'mypkg.nets:make_net') -> ConfigError:
  """The error for ``text`` that is neither one of ``names`` nor ``MODULE:NAME``
  (a dotted path without ``':'`` gets the path it probably meant)."""
  known = f'one of {tuple(names)} or ' if names else ''
  return ConfigError(f'{field}: expected {known}MODULE:{what}, an import path with a colon '
                     f'(e.g. {example}), got {text!r}{path_hint(text)}')


def user(path: str, field: str) -> Any:
  """The object a user's import path ``module.path:name`` names, for the
  command line's ``--model``, ``--loss`` and ``--dataset``.

  The module is imported from ``sys.path`` (``PYTHONPATH``); the current
  directory is searched last, as ``python -m purax`` searches it first, so
  ``purax train --model mynets:make_net`` finds ``./mynets.py`` either way.

  Raises:
    ConfigError: naming ``field``: ``path`` without ``':'``; a module that does
      not import (naming it and the ImportError); a name the module does not
      define (naming the close ones, or those it defines).
  """
  if not is_import_path(path):
    raise expected_path(field, path)
  module_name, _, attr = path.partition(':')
  if os.getcwd() not in sys.path and '' not in sys.path:
    sys.path.append(os.getcwd())
  try:
    obj = importlib.import_module(module_name)
  except ImportError as e:
    raise ConfigError(f'{field}: expected module {module_name!r} to import (from sys.path, '
                      f'PYTHONPATH or the current directory), got {type(e).__name__}: {e}'
                      ) from None
  where = module_name
  for part in attr.split('.'):
    if not hasattr(obj, part):
      names = sorted(n for n in dir(obj) if not n.startswith('_'))
      close = difflib.get_close_matches(part, names, n=3, cutoff=0.5)
      hint = (f'did you mean {" or ".join(close)}?' if close else
              f"it defines {', '.join(names[:12]) + (', ...' if len(names) > 12 else '')}"
              if names else 'it defines no public name')
      raise ConfigError(f'{field}: expected a name that {where} defines ({hint}), got '
                        f'{part!r} in {path!r}')
    obj, where = getattr(obj, part), f'{where}.{part}'
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


def modules(*names: str) -> tuple[Any, ...]:
  """:func:`module` of each name, in order: ``metrics_lib, pop_lib =
  lazy.modules('purax.core.metrics', 'purax.core.population')``."""
  return tuple(_Module(name) for name in names)


def attach(package: str, names: Mapping[str, str], deprecated: Mapping[str, tuple] = {}
           ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
  """``__getattr__`` and ``__dir__`` for a package whose public names are
  bound on first access (PEP 562)::

    __getattr__, __dir__ = lazy.attach(__name__, {'Task': 'purax.core.task:Task'})

  ``names`` maps each public name to its import path; ``dir(package)`` lists
  them. A name bound once is kept in the package (later accesses are plain
  lookups); a name outside the table that is a submodule (``purax.core.task``)
  is imported as one (in a package; a module may attach names too). ``deprecated`` maps an old spelling to ``(import path,
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
    if '__path__' in namespace:      # a package: the name may be a submodule (not a module's)
      try:
        return resolve(f'{package}.{name}')
      except ModuleNotFoundError as e:
        if e.name != f'{package}.{name}':
          raise
    raise AttributeError(f'module {package!r} has no attribute {name!r}')

  def __dir__() -> list[str]:
    return sorted({*namespace, *names})

  return __getattr__, __dir__


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """The import finder of :func:`moved`: an old module path imports the module
  that replaced it (the same module object), with a ``DeprecationWarning``."""

  def __init__(self):
    self.table: dict[str, tuple[str, str]] = {}

  def find_spec(self, name, path=None, target=None):
    del path, target
    return importlib.util.spec_from_loader(name, self) if name in self.table else None

  def create_module(self, spec):
    new, until = self.table[spec.name]
    warnings.warn(f'purax: module {spec.name} is deprecated: use {new} (it goes in {until}; '
                  'CHANGELOG.md)', DeprecationWarning, stacklevel=2)
    return importlib.import_module(new)   # its own __name__ and __spec__ are kept

  def exec_module(self, module):
    del module   # already executed under its new name


_MOVED = _MovedModules()


def moved(old: str, new: str, until: str = '0.4') -> None:
  """Keeps the import path ``old`` of a module renamed to ``new`` working:
  ``import old`` (and ``from package import old_name``) gives module ``new``
  itself, with a ``DeprecationWarning`` naming ``new``, and no file of the
  old name is left (``tests/test_layers.py`` holds that no two modules share
  a file name). Called by the old module's package ``__init__``, which any
  import of ``old`` runs first.
  """
  _MOVED.table[old] = (new, until)
  if _MOVED not in sys.meta_path:
    sys.meta_path.append(_MOVED)
