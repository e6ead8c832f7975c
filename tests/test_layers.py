"""The import direction of the package (DESIGN.md "Layout"): core imports
nothing else of purax; nn only core; io and parallel only core, io and
parallel; hooks, plan, loop and tune never the application layer; nothing imports it."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / 'purax'

#: What each layer may import of purax, besides itself.
ALLOWED = {
    'core': set(),
    'nn': {'core'},
    'io': {'core', 'parallel'},
    'parallel': {'core', 'io'},
    'hooks': {'core', 'io', 'parallel'},
    'plan': {'core', 'io', 'parallel'},
    'loop': {'core', 'io', 'parallel', 'hooks', 'plan'},
    'tune': {'core', 'io', 'parallel', 'hooks', 'plan', 'loop'},
    'testing': {'core', 'io', 'parallel', 'nn', 'plan', 'hooks', 'loop'},
}


def layer(module: str) -> str:
  parts = module.split('.')
  return parts[1] if len(parts) > 1 else ''


def imports(path: pathlib.Path) -> set[str]:
  """The purax modules ``path`` imports (at any depth: a lazy import counts)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
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
    if layer(name) in ALLOWED:
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
