"""The import direction of the package (DESIGN.md "Layout"): core imports
nothing else of purax; nn and inspect only core; io and parallel only core, io and
parallel; hooks, plan, loop and tune never the application layer; nothing imports it.
An import deferred to its use (an import path of :mod:`purax.core.lazy`) counts."""

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / 'purax'

#: What each layer may import of purax, besides itself.
ALLOWED = {
    'core': set(),
    'nn': {'core'},
    'io': {'core', 'parallel'},
    'parallel': {'core', 'io'},
    'inspect': {'core'},
    'hooks': {'core', 'io', 'parallel', 'inspect'},
    'plan': {'core', 'io', 'parallel', 'inspect'},
    'loop': {'core', 'io', 'parallel', 'hooks', 'plan', 'inspect'},
    'tune': {'core', 'io', 'parallel', 'hooks', 'plan', 'loop', 'inspect'},
    'testing': {'core', 'io', 'parallel', 'nn', 'plan', 'hooks', 'loop', 'inspect'},
}


def is_moved(path: pathlib.Path) -> bool:
  """Whether ``path`` is the old path of a moved module (its body a
  ``lazy.moved(__name__, new, ...)`` call): an alias of the new module, kept
  until the version it names, not a module of its old layer."""
  body = [n for n in ast.parse(path.read_text()).body
          if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
  imports_ = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
  rest = [n for n in body if n not in imports_]
  return (len(rest) == 1 and isinstance(rest[0], ast.Expr) and isinstance(rest[0].value, ast.Call)
          and getattr(rest[0].value.func, 'attr', None) == 'moved')


def layer(module: str) -> str:
  parts = module.split('.')
  return parts[1] if len(parts) > 1 else ''


#: An import path resolved on use (:mod:`purax.core.lazy`): ``'purax.nn.mlp:MLP'``,
#: ``'purax.core.precision'``.
IMPORT_PATH = re.compile(r'(purax(?:\.\w+)+)(?::[\w.]+)?')


def is_module(name: str) -> bool:
  """Whether ``name`` is a module or package of purax (a file under PACKAGE)."""
  base = PACKAGE.parent.joinpath(*name.split('.'))
  return base.with_suffix('.py').is_file() or (base / '__init__.py').is_file()


def imports(path: pathlib.Path) -> set[str]:
  """The purax modules ``path`` imports (at any depth: a lazy import counts,
  and so does an import path that :mod:`purax.core.lazy` resolves on use)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    path_match = (IMPORT_PATH.fullmatch(node.value)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
    if path_match and is_module(path_match.group(1)):
      found.add(path_match.group(1))
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names = [node.module] + [f'{node.module}.{a.name}' for a in node.names]
      found.update(n for n in names[:1] if n.startswith('purax'))
      if node.module == 'purax':
        found.update(f'purax.{a.name}' for a in node.names)
    elif isinstance(node, ast.Import):
      found.update(a.name for a in node.names if a.name.startswith('purax'))
  return found


def modules():
  for path in sorted(PACKAGE.rglob('*.py')):
    rel = path.relative_to(PACKAGE.parent).with_suffix('')
    name = '.'.join(rel.parts).removesuffix('.__init__')
    if layer(name) in ALLOWED and not is_moved(path):
      yield name, path


@pytest.mark.parametrize('name, path', list(modules()), ids=lambda x: str(x))
def test_imports_point_one_way(name, path):
  own = layer(name)
  bad = sorted(m for m in imports(path) if m != 'purax' and layer(m) != own
               and layer(m) not in ALLOWED[own])
  assert not bad, f'{name} imports {bad}: {own} may import only {sorted(ALLOWED[own])}'


def test_nothing_imports_the_application_layer():
  users = sorted(name for name, path in modules()
                 if any(layer(m) == 'app' for m in imports(path)))
  assert not users, users


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
  argument of each ``lazy.module(...)`` / ``lazy.resolve(...)`` call."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Call) and getattr(node.func, 'attr', None) in ('module', 'resolve'):
      found += [a.value for a in node.args[:1] if isinstance(a, ast.Constant)
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
