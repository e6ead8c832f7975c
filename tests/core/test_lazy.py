"""purax.core.lazy: import paths resolved on use, module stand-ins, and the
packages whose public names are bound on first access (PEP 562)."""

import ast
import importlib
import pathlib
import pkgutil

import pytest

import purax
from purax.core import lazy

#: The packages with a lazy ``__init__`` (:func:`purax.core.lazy.attach`).
LAZY = ('purax', 'purax.core', 'purax.io', 'purax.tune')


def test_resolve_names_a_module_an_attribute_or_passes_an_object_through():
  assert lazy.resolve('purax.core.errors') is importlib.import_module('purax.core.errors')
  assert lazy.resolve('purax.core.errors:ConfigError') is purax.ConfigError
  assert lazy.resolve('purax.core.bounds:BOUNDS.get') == purax.core.bounds.BOUNDS.get
  assert lazy.resolve(purax.ConfigError) is purax.ConfigError and lazy.resolve(None) is None
  with pytest.raises(ModuleNotFoundError, match='purax.core.nope'):
    lazy.resolve('purax.core.nope:X')
  with pytest.raises(AttributeError, match='Nope'):
    lazy.resolve('purax.core.errors:Nope')


def test_a_module_stand_in_reads_the_module():
  errors = lazy.module('purax.core.errors')
  assert errors.expect is importlib.import_module('purax.core.errors').expect
  assert 'ConfigError' in dir(errors) and "'purax.core.errors'" in repr(errors)
  with pytest.raises(AttributeError):
    errors.nope


def public_names(package: str) -> dict[str, str]:
  """The table a lazy package gives :func:`purax.core.lazy.attach`: name -> import path."""
  source = pathlib.Path(importlib.import_module(package).__file__).read_text()
  table = next(node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Dict))
  return {k.value: v.value for k, v in zip(table.keys, table.values)}


@pytest.mark.parametrize('package', LAZY)
def test_a_lazy_package_binds_every_public_name_and_lists_it(package):
  """Each public name is the object its path names and is in dir() (what the
  API reference reads), and a submodule outside the table is still an attribute."""
  module, names = importlib.import_module(package), public_names(package)
  assert names and set(names) <= set(dir(module))
  for name, path in names.items():
    assert getattr(module, name) is lazy.resolve(path), name
    assert name in vars(module), name        # bound: the next access is a plain lookup
  with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'nope'"):
    getattr(module, 'nope')
  other = next(m.name for m in pkgutil.iter_modules(module.__path__)
               if not m.name.startswith('_') and m.name not in names)
  assert getattr(module, other) is importlib.import_module(f'{package}.{other}')


@pytest.mark.parametrize('package', LAZY)
def test_no_public_name_is_a_submodule_of_another_meaning(package):
  """A public name that is also a submodule's name must be that submodule:
  importing the submodule binds its name in the package, which would hide a
  function of the same name (purax.nn.generate, purax.parallel.shard: those
  packages stay eager)."""
  names = public_names(package)
  submodules = {m.name for m in pkgutil.iter_modules(importlib.import_module(package).__path__)}
  for name in set(names) & submodules:
    assert names[name] == f'{package}.{name}', (name, names[name])


def test_the_top_level_names_are_the_same_objects_as_before():
  """`import purax; purax.Task` and `from purax import fit` as with the eager __init__."""
  from purax import fit
  from purax.core.task import Task
  from purax.loop import fit as loop_fit
  assert purax.Task is Task and fit is loop_fit
  assert purax.hyperparams is purax.core.hparams.get and purax.metrics is purax.core.metrics
  assert purax.parallel.shard is importlib.import_module('purax.parallel.shard').shard
  assert isinstance(purax.__version__, str)
