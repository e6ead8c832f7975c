"""The suite mirrors the package (STYLE.md "Tests"), read from the files
(nothing imported):

- each module of ``purax/`` that defines public names (a function, class or
  assignment at its top level without a leading underscore) has its test
  file: ``purax/a/b.py`` -> ``tests/a/test_b.py``, ``purax/loop.py`` ->
  ``tests/test_loop.py``; an aggregator ``__init__`` (it only imports and
  re-exports) needs none;
- a test module imports no other test module: what tests share lives in
  ``tests/helpers*.py`` (or a support module of ``tests/`` that is not a test);
- ``tests/core`` imports nothing of the application layer (``purax.app``).
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / 'purax'
TESTS = ROOT / 'tests'

#: Modules with public names and no test file of their name yet: their tests
#: are in other files today (grep tests/ for the module's names). To shrink:
#: move those tests into the mirrored file (``git mv`` or moving the test
#: functions) and delete the entry; an entry whose mirrored file exists fails
#: the test, so the list only shrinks.
NOT_MIRRORED = (
    'purax/app/commands.py',
    'purax/app/data.py',
    'purax/app/report.py',
    'purax/core/errors.py',
    'purax/core/shapes.py',
    'purax/core/state.py',
    'purax/core/strategies.py',
    'purax/hooks/standard.py',
    'purax/io/checkpoint/quiet.py',
    'purax/io/checkpoint/replay.py',
    'purax/io/compile_time.py',
    'purax/io/formats.py',
    'purax/nn/cnn.py',
    'purax/nn/mlp.py',
    'purax/nn/resnet.py',
    'purax/parallel/plan.py',
    'purax/inspect/intercept.py',
    'purax/testing/__init__.py',
    'purax/tune/lr_rules.py',
)


def public_names(path: pathlib.Path) -> list[str]:
  """The public names a module defines at its top level (imports excluded)."""
  names = []
  for node in ast.parse(path.read_text(encoding='utf-8')).body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.append(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      names += [t.id for t in targets if isinstance(t, ast.Name) and t.id != '__all__']
  return [n for n in names if not n.startswith('_')]


def mirrored(module: pathlib.Path) -> pathlib.Path:
  """``purax/a/b.py`` -> ``tests/a/test_b.py``; a package's ``__init__.py``
  -> ``tests/a/test_a.py``; ``__main__.py`` -> ``tests/test___main__.py``."""
  parts = module.relative_to(PACKAGE).with_suffix('').parts
  name = parts[-2] if parts[-1] == '__init__' and len(parts) > 1 else parts[-1]
  return TESTS.joinpath(*parts[:-1], f'test_{name}.py').relative_to(ROOT)


def modules() -> list[pathlib.Path]:
  return sorted(PACKAGE.rglob('*.py'))


def test_each_module_with_public_names_has_its_mirrored_test_file():
  missing, stale = [], []
  for module in modules():
    rel = str(module.relative_to(ROOT))
    if not public_names(module):
      continue
    test = mirrored(module)
    if (ROOT / test).is_file():
      if rel in NOT_MIRRORED:
        stale.append(f'{rel}: {test} exists; delete its NOT_MIRRORED entry')
    elif rel not in NOT_MIRRORED:
      missing.append(f'{rel}: no {test}')
  gone = sorted(set(NOT_MIRRORED) - {str(m.relative_to(ROOT)) for m in modules()})
  assert not missing, 'modules without their mirrored test file:\n' + '\n'.join(missing)
  assert not stale, '\n'.join(stale)
  assert not gone, f'NOT_MIRRORED names modules that are not there: {gone}'


def imports(path: pathlib.Path) -> list[str]:
  """Every module a file imports, at any depth (deferred imports included)."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
    if isinstance(node, ast.Import):
      found += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      found.append(node.module)
      found += [f'{node.module}.{a.name}' for a in node.names]
  return found


def is_test_module(name: str) -> bool:
  return name.startswith('tests.') and name.rsplit('.', 1)[-1].startswith('test_')


def test_no_test_module_imports_another():
  offenders = [f'{p.relative_to(ROOT)} imports {name}' for p in sorted(TESTS.rglob('*.py'))
               for name in imports(p) if is_test_module(name)]
  assert not offenders, ('shared code goes into tests/helpers*.py:\n' + '\n'.join(offenders))


def test_core_tests_import_no_application_code():
  offenders = [f'{p.relative_to(ROOT)} imports {name}'
               for p in sorted((TESTS / 'core').rglob('*.py'))
               for name in imports(p) if name == 'purax.app' or name.startswith('purax.app.')]
  assert not offenders, '\n'.join(offenders)


@pytest.mark.parametrize('module, expected', [
    ('purax/core/update.py', 'tests/core/test_update.py'),
    ('purax/io/checkpoint/run.py', 'tests/io/checkpoint/test_run.py'),
    ('purax/loop.py', 'tests/test_loop.py'),
    ('purax/testing/__init__.py', 'tests/testing/test_testing.py'),
])
def test_the_mirror_of_a_module(module, expected):
  assert str(mirrored(PACKAGE.parent / module)) == expected
