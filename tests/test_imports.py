"""The import direction of every package pair (docs/design.md, "Import
directions"): every ``import`` / ``from ... import`` of every module of
``purax/``, read from the source (ast, nothing imported), goes from a package
to itself or to a package its row of the table names, and the packages'
imports hold no cycle."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PURAX = os.path.join(ROOT, 'purax')
DESIGN = os.path.join(ROOT, 'docs', 'design.md')

#: Modules at the top of purax and the package each counts as.
TOP = {'__init__': 'purax', '__main__': '__main__', 'loop': 'loop', 'resume': 'loop'}


def package_of(module: str) -> str:
  """The package a module of purax counts as (``purax.plan.feed`` -> ``plan``)."""
  parts = module.split('.')
  if len(parts) == 1:
    return 'purax'
  if os.path.isdir(os.path.join(PURAX, parts[1])):
    return parts[1]
  return TOP.get(parts[1], parts[1])


def module_name(path: str) -> str:
  rel = os.path.relpath(path, ROOT)[:-len('.py')].split(os.sep)
  return '.'.join(rel[:-1] if rel[-1] == '__init__' else rel)


def imported(path: str) -> list[tuple[str, int]]:
  """``(module of purax, line)`` of every import in the file at ``path``."""
  tree = ast.parse(open(path, encoding='utf-8').read(), path)
  name = module_name(path)
  is_package = path.endswith('__init__.py')
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [(a.name, node.lineno) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:           # relative: from the module's package
        here = name.split('.')[:len(name.split('.')) - node.level + is_package]
        base = '.'.join(here + ([base] if base else []))
      for a in node.names:     # `from purax import plan`: the subpackage plan
        sub = f'{base}.{a.name}'
        top = sub.split('.')
        out.append((sub if len(top) == 2 and (
            os.path.isdir(os.path.join(PURAX, top[1]))
            or os.path.isfile(os.path.join(PURAX, top[1] + '.py'))) else base, node.lineno))
  return [(m, line) for m, line in out if m == 'purax' or m.startswith('purax.')]


def arrows() -> dict[tuple[str, str], str]:
  """``{(package, package it imports): 'file:line' of one such import}``."""
  found = {}
  for folder, _, files in os.walk(PURAX):
    for file in sorted(files):
      if file.endswith('.py'):
        path = os.path.join(folder, file)
        source = package_of(module_name(path))
        for target, line in imported(path):
          target = package_of(target)
          if target != source:
            found.setdefault((source, target), f'{os.path.relpath(path, ROOT)}:{line}')
  return found


def table(text: str) -> dict[str, set[str]]:
  """The design doc's import table: ``{package: packages it may import}``."""
  section = re.search(r'^### Import directions\n(.*?)(?=^#|\Z)', text, re.M | re.S)
  assert section, 'docs/design.md: expected a section "### Import directions", got none'
  rows = re.findall(r'^\| `([\w_]+)` \| (.*?) \|$', section.group(1), re.M)
  assert rows, 'docs/design.md "Import directions": expected a table of packages, got none'
  return {package: set(re.findall(r'`([\w_]+)`', allowed)) for package, allowed in rows}


def cycle(edges) -> list[str] | None:
  """One cycle of the directed graph ``edges`` (pairs), or None."""
  graph = {}
  for a, b in edges:
    graph.setdefault(a, set()).add(b)
  state = {}

  def visit(node, path):
    state[node] = 'open'
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 'open':
        return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
      if nxt not in state:
        found = visit(nxt, path + [nxt])
        if found:
          return found
    state[node] = 'done'
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node, [node])
      if found:
        return found
  return None


def unlisted(found: dict, allowed: dict) -> list[str]:
  return sorted(f'{a} -> {b} ({where})' for (a, b), where in found.items()
                if b not in allowed.get(a, set()))


def test_every_import_between_packages_is_an_arrow_of_the_design_table():
  allowed = table(open(DESIGN, encoding='utf-8').read())
  found = arrows()
  packages = {a for a, _ in found} | {b for _, b in found}
  assert not packages - set(allowed), (
      f'docs/design.md "Import directions": expected a row for every package, got none for '
      f'{sorted(packages - set(allowed))}')
  bad = unlisted(found, allowed)
  assert not bad, f'imports against docs/design.md "Import directions": {bad}'


def test_the_packages_imports_hold_no_cycle():
  found = arrows()
  loop = cycle(found)
  assert loop is None, ('a cycle of package imports: ' + ' -> '.join(loop) + ' ('
                        + ', '.join(found[(a, b)] for a, b in zip(loop, loop[1:])) + ')')
  allowed = table(open(DESIGN, encoding='utf-8').read())
  loop = cycle((a, b) for a, targets in allowed.items() for b in targets)
  assert loop is None, f'docs/design.md "Import directions" allows a cycle: {loop}'


def test_nothing_but_the_entry_point_imports_the_application_layer():
  found = arrows()
  assert sorted(a for a, b in found if b == 'app') == ['__main__']


def test_the_checks_fail_on_a_cycle_and_on_an_unlisted_arrow():
  """The test itself: an arrow missing from the table and a cycle are caught."""
  allowed = {'core': set(), 'io': {'core'}, 'parallel': {'core'}}
  assert unlisted({('io', 'parallel'): 'purax/io/x.py:1'}, allowed) == [
      'io -> parallel (purax/io/x.py:1)']
  assert unlisted({('io', 'core'): 'purax/io/x.py:1'}, allowed) == []
  assert cycle([('io', 'parallel'), ('parallel', 'io'), ('io', 'core')]) in (
      ['io', 'parallel', 'io'], ['parallel', 'io', 'parallel'])
  assert cycle([('plan', 'io'), ('plan', 'parallel'), ('io', 'core')]) is None


@pytest.mark.parametrize('line, target', [
    ('from purax.plan import feed', 'plan'), ('import purax.io.pipeline', 'io'),
    ('from purax import parallel', 'parallel'), ('from purax import __version__', 'purax'),
    ('from purax.resume import restore_or_init', 'loop')])
def test_an_import_is_read_as_the_package_it_names(tmp_path, line, target):
  probe = tmp_path / 'probe.py'
  probe.write_text(line + '\n')
  assert [package_of(m) for m, _ in imported(str(probe))] == [target]
