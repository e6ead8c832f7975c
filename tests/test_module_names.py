"""One name per thing, for modules: no two modules of purax share a file name
(``purax.hooks.loop`` beside ``purax.loop`` was two things called ``loop``),
and each renamed module's old import path still gives the new module, with a
``DeprecationWarning`` naming it (:func:`purax.core.lazy.moved`)."""

import collections
import importlib
import importlib.util
import pathlib
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / 'purax'

#: Old import path -> the module that replaced it (0.3).
MOVED = {
    'purax.hooks.loop': 'purax.hooks.runner',
    'purax.app.hparams': 'purax.app.hparam_table',
    'purax.app.optimizers': 'purax.app.optimizer_table',
    'purax.app.memory': 'purax.app.fit_memory',
    'purax.tune.rules': 'purax.tune.lr_rules',
    'purax.testing.strategies': 'purax.testing.hypotheses',
    'purax.io.checkpoint.errors': 'purax.core.errors',
    'purax.core.summary': 'purax.inspect.summary',
    'purax.core.flops': 'purax.inspect.flops',
    'purax.core.nonfinite': 'purax.inspect.nan',
    'purax.core.intercept': 'purax.inspect.intercept',
}


def duplicates(root: pathlib.Path) -> dict[str, list[str]]:
  """File name -> its paths, for the names of more than one module under ``root``."""
  paths = collections.defaultdict(list)
  for path in root.rglob('*.py'):
    if path.name != '__init__.py':
      paths[path.name].append(str(path.relative_to(root.parent)))
  return {name: sorted(p) for name, p in paths.items() if len(p) > 1}


def test_no_two_modules_share_a_file_name():
  found = duplicates(PACKAGE)
  assert not found, f'modules of one file name: {found} (rename one; docs/design.md "Layout")'


def test_the_check_finds_a_duplicate(tmp_path):
  for part in ('a', 'b'):
    (tmp_path / 'pkg' / part).mkdir(parents=True)
    (tmp_path / 'pkg' / part / 'same.py').write_text('')
    (tmp_path / 'pkg' / part / '__init__.py').write_text('')
  assert duplicates(tmp_path / 'pkg') == {'same.py': ['pkg/a/same.py', 'pkg/b/same.py']}


CHECK = """
import importlib, sys, warnings
for old, new in sorted(MOVED.items()):
  package, _, leaf = old.rpartition('.')
  importlib.import_module(package)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    got = getattr(__import__(package, fromlist=[leaf]), leaf)   # from package import leaf
  assert got is importlib.import_module(new), (old, got)
  assert [str(w.message) for w in caught if w.category is DeprecationWarning
          and new in str(w.message) and old in str(w.message)], (old, caught)
  assert importlib.import_module(old) is got, old             # import package.leaf
"""


def test_an_old_module_path_imports_its_new_module_with_a_warning():
  """In a fresh interpreter, where no old path was imported yet."""
  done = subprocess.run([sys.executable, '-c', f'MOVED = {MOVED!r}\n{CHECK}'],
                        capture_output=True, text=True, timeout=300, cwd=PACKAGE.parent)
  assert done.returncode == 0, done.stderr[-2000:]


def test_no_file_is_left_at_an_old_path():
  for old in MOVED:
    assert not PACKAGE.parent.joinpath(*old.split('.')).with_suffix('.py').exists(), old
    assert importlib.util.find_spec(old.rpartition('.')[0]) is not None
