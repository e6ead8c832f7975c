"""Every import path resolved on use (:mod:`purax.core.lazy`: ``'purax.nn.mlp:MLP'``)
names a module and an attribute it defines, checked statically. The import
direction of the packages is tests/test_imports.py's (docs/design.md's table)."""

import ast
import pathlib
import re


PACKAGE = pathlib.Path(__file__).resolve().parents[1] / 'purax'

#: An import path resolved on use (:mod:`purax.core.lazy`): ``'purax.nn.mlp:MLP'``,
#: ``'purax.core.precision'``.
IMPORT_PATH = re.compile(r'(purax(?:\.\w+)+)(?::[\w.]+)?')


def is_module(name: str) -> bool:
  """Whether ``name`` is a module or package of purax (a file under PACKAGE)."""
  base = PACKAGE.parent.joinpath(*name.split('.'))
  return base.with_suffix('.py').is_file() or (base / '__init__.py').is_file()


def top_level_names(path: pathlib.Path) -> set[str]:
  """What a module defines or imports at its top level."""
  names = set()
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names.update((a.asname or a.name).split('.')[0] for a in node.names)
  return names


def lazy_paths(path: pathlib.Path) -> list[str]:
  """The import paths in ``path``: every ``'purax.x.y:NAME'`` string, and the
  arguments of each ``lazy.module(...)`` / ``lazy.modules(...)`` / ``lazy.resolve(...)`` call."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Call) and getattr(node.func, 'attr', None) in ('module', 'modules',
                                                                          'resolve'):
      found += [a.value for a in node.args if isinstance(a, ast.Constant)
                and isinstance(a.value, str) and a.value.startswith('purax')]
    elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
          and ':' in node.value and IMPORT_PATH.fullmatch(node.value)):
      found.append(node.value)
  return found


def test_every_import_path_names_a_module_and_its_attribute():
  """A row's import path (``'purax.nn.mlp:MLP'``) is checked here, statically
  (an exporter's module needs its optional package), not first at its use."""
  checked = 0
  for path in sorted(PACKAGE.rglob('*.py')):
    for target in lazy_paths(path):
      module, _, attr = target.partition(':')
      assert is_module(module), (str(path), target)
      if attr:
        base = PACKAGE.parent.joinpath(*module.split('.'))
        source = base.with_suffix('.py') if base.with_suffix('.py').is_file() else (
            base / '__init__.py')
        assert attr.split('.')[0] in top_level_names(source), (str(path), target)
      checked += 1
  assert checked >= 70, checked    # the lazy packages, the tables, the stand-ins
