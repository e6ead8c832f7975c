"""The public API as data: every public name of purax and of its public
subpackages, with its signature (classes: the constructor and each public
method and property). ``tests/test_public_api.py`` holds it against the
record of the last release (``tests/fixtures/public_api_0.2.0.json``) and
CHANGELOG.md.

Usage: ``python -m tests.api_snapshot OUT.json`` (``-``: stdout; records the
tree on ``sys.path``: at a release, the record of the next comparison).
"""

import importlib
import inspect
import json
import os
import re
import sys
import types

#: The public packages: ``__all__`` where they declare it, else their
#: re-exported names (a package) or the names they define (a module).
PACKAGES = ('purax', 'purax.hooks', 'purax.plan', 'purax.parallel', 'purax.nn',
            'purax.testing', 'purax.tune', 'purax.io.checkpoint', 'purax.metrics',
            'purax.objectives')


def _signature(obj) -> str:
  try:
    text = str(inspect.signature(obj))
  except (TypeError, ValueError):
    return '(...)'
  return re.sub(r' at 0x[0-9a-f]+', '', text)      # a default's repr: no address


def _names(module) -> list[str]:
  declared = getattr(module, '__all__', None)
  if declared is not None:
    return sorted(declared)
  is_package = hasattr(module, '__path__')
  out = []
  for name in dir(module):
    if name.startswith('_'):
      continue
    try:
      obj = getattr(module, name)
    except AttributeError:
      continue
    if isinstance(obj, types.ModuleType) and not (is_package and name in ('metrics', 'objectives')
                                                   and module.__name__ == 'purax'):
      continue
    if not is_package and getattr(obj, '__module__', module.__name__) != module.__name__:
      continue                 # imported into the module, not its own
    out.append(name)
  return sorted(out)


def describe(obj) -> dict | str:
  """A public object's record: a signature string, or for a class its
  constructor, methods and properties."""
  if isinstance(obj, types.ModuleType):
    return 'module'
  if inspect.isclass(obj):
    members = {}
    for name, value in sorted(vars(obj).items()):
      if name.startswith('_'):
        continue
      if isinstance(value, property):
        members[name] = 'property'
      elif isinstance(value, (staticmethod, classmethod)):
        members[name] = _signature(value.__func__)
      elif inspect.isfunction(value):
        members[name] = _signature(value)
    return {'class': _signature(obj), **members}
  if callable(obj):
    return _signature(obj)
  return type(obj).__name__


def snapshot() -> dict:
  """``{'purax.NAME': record}`` for every public name of :data:`PACKAGES`."""
  import purax
  root = os.path.dirname(os.path.dirname(os.path.abspath(purax.__file__)))
  out = {}
  for package in PACKAGES:
    if package in ('purax.metrics', 'purax.objectives'):
      module = getattr(purax, package.split('.')[1], None)
    else:
      try:
        module = importlib.import_module(package)
      except ImportError:
        continue                # not in this version
    if module is None or not os.path.abspath(module.__file__).startswith(root):
      continue                  # not in this version (another tree's found instead)
    for name in _names(module):
      obj = getattr(module, name)
      if isinstance(obj, types.ModuleType) and name not in ('metrics', 'objectives'):
        continue                # a package is recorded by its names (PACKAGES)
      out[f'{package}.{name}'] = describe(obj)
  return out


if __name__ == '__main__':
  text = json.dumps(snapshot(), indent=1, sort_keys=True) + '\n'
  if sys.argv[1] == '-':
    sys.stdout.write(text)
  else:
    with open(sys.argv[1], 'w') as f:
      f.write(text)
