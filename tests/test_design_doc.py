"""``docs/design.md`` cites only what exists.

The page names homes (``purax/core/update.py``, ``purax/plan/``, a file of the
row's directory: ``loss_scale.py``), dotted names (``purax.plan.Plan``,
``purax.io.datasets.load``), calls with keywords (``purax.Task(model, tx,
loss=...)``) and bare names that belong to what the same row or bullet cites
(``MODELS`` of ``purax/app/models.py``, ``place`` of ``purax.plan.Plan``,
``_Loop.finish`` of ``purax/hooks/loop.py``). Paths are checked on disk; names
are resolved in one child process that imports what the page cites and
getattr's each name (so this process's imports and settings play no part).

What a block (a table row, a bullet, a paragraph) cites in backticks:

- a path (has a ``/`` or ends in ``.py``/``.md``): it exists (from the
  repository root, or else in the directory of the block's last full path);
- ``purax.a.b(...)``: the longest importable prefix is a module, the rest an
  attribute chain on it; the keywords of a call are its parameters;
- a bare identifier or ``A.b``: an attribute of a module or object the same
  block cites, or of ``purax``;
- anything else (a command line, a flag, ``jax.grad``, a value) is prose.
"""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DESIGN = os.path.join(ROOT, 'docs', 'design.md')

IDENT = r'[A-Za-z_][A-Za-z0-9_]*'
NAME = re.compile(rf'{IDENT}(?:\.{IDENT})*')
CALL = re.compile(rf'(purax(?:\.{IDENT})+)\((.*)\)', re.S)
#: Identifiers in backticks that are not Python names of purax (say why).
NOT_NAMES = {
    'purax',  # the command (the package is cited as purax/...)
}
#: A dotted span starting with one of these is prose: another library's name.
OTHERS = ('jax', 'flax', 'optax', 'orbax', 'numpy', 'np', 'grain', 'chex')
#: A span ending in one of these is a file a run writes, not a repository file.
DATA_FILES = ('.json', '.jsonl', '.txt', '.csv')


def blocks(text: str) -> list[str]:
  """The page cut into table rows, bullets and paragraphs."""
  out, current = [], []
  for line in text.splitlines():
    starts = line.startswith(('|', '- ', '#')) or not line.strip()
    if starts and current:
      out.append('\n'.join(current))
      current = []
    if line.strip() and not line.startswith('#'):
      current.append(line)
    if line.startswith('|'):
      out.append(line)
      current = []
  if current:
    out.append('\n'.join(current))
  return out


def spans(block: str) -> list[str]:
  return [s.strip() for s in re.findall(r'`([^`]+)`', block)]


def is_path(span: str) -> bool:
  return (' ' not in span and ('/' in span or span.endswith(('.py', '.md')))
          and not span.startswith('-'))


def module_of(path: str) -> str | None:
  """``purax/a/b.py`` -> ``purax.a.b``; ``purax/a/`` -> ``purax.a``."""
  if not path.startswith('purax/'):
    return None
  path = path.rstrip('/')
  if path.endswith('.py'):
    path = path[:-3]
  name = path.replace('/', '.')
  return name[:-len('.__init__')] if name.endswith('.__init__') else name


def citations(text: str) -> tuple[list[str], list[dict]]:
  """``(missing paths, name checks)``: each check names what to resolve and
  the modules/objects of its block to resolve a bare name against."""
  missing, checks = [], []
  for block in blocks(text):
    here, homes, calls, bare = None, [], [], []
    for span in spans(block):
      if is_path(span):
        candidates = [span]
        if here and '/' not in span.rstrip('/'):
          candidates.append(os.path.join(here, span))
        found = next((c for c in candidates if os.path.exists(os.path.join(ROOT, c))), None)
        if found is None:
          missing.append(f'{span!r} in: {block.strip()[:120]}')
          continue
        if '/' in span:
          here = os.path.dirname(span.rstrip('/')) if span.endswith('.py') else span.rstrip('/')
        if module_of(found):
          homes.append(module_of(found))
        continue
      call = CALL.fullmatch(span)
      if call:
        keywords = re.findall(rf'({IDENT})=', call.group(2))
        calls.append({'name': call.group(1), 'keywords': keywords})
        homes.append(call.group(1))
      elif NAME.fullmatch(span) and span.startswith('purax.'):
        calls.append({'name': span, 'keywords': []})
        homes.append(span)
      elif (NAME.fullmatch(span) and span not in NOT_NAMES and span.split('.')[0] not in OTHERS
            and not span.endswith(DATA_FILES)):
        bare.append(span)
    checks.extend({**c, 'block': block.strip()[:120]} for c in calls)
    checks.extend({'name': b, 'keywords': [], 'homes': homes + ['purax'],
                   'block': block.strip()[:120]} for b in bare)
  return missing, checks


#: Run in a child process: resolves each check, prints the failures as JSON.
RESOLVE = r'''
import ast, importlib, importlib.util, inspect, json, sys, warnings
warnings.simplefilter('ignore')
checks = json.load(sys.stdin)

def defined(module, name):
  # a module file (not a package, which re-exports on purpose) defines the
  # name it is cited for: a name it only imports has its home elsewhere
  if hasattr(module, '__path__'):
    return
  tree = ast.parse(inspect.getsource(module))
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
      return
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, 'target', None)]
    if any(isinstance(t, ast.Name) and t.id == name for t in targets):
      return
  home = getattr(getattr(module, name), '__module__', '?')
  raise LookupError(f'{name} is not defined in {module.__name__} (its home: {home})')

def within(obj, dotted):
  if inspect.ismodule(obj):
    defined(obj, dotted.split('.')[0])
  for attr in dotted.split('.'):
    obj = member(obj, attr)
  return obj

def resolve(dotted):
  if dotted.endswith('__main__'):   # an entry point runs when imported: found, not run
    if importlib.util.find_spec(dotted) is None:
      raise ImportError(dotted)
    return None
  parts = dotted.split('.')
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module('.'.join(parts[:i]))
    except ImportError:
      continue
    return within(obj, '.'.join(parts[i:])) if parts[i:] else obj
  raise ImportError(dotted)

def parameters(obj):
  """Its parameter names; None when it takes any keyword."""
  try:
    found = inspect.signature(obj).parameters.values()
  except (TypeError, ValueError):
    return set()
  if any(p.kind is p.VAR_KEYWORD for p in found):
    return None
  return {p.name for p in found}

def member(obj, attr):
  if attr == '__main__' and inspect.ismodule(obj):   # found, not run (see resolve)
    return resolve(f'{obj.__name__}.__main__')
  # an attribute, or a field of a dataclass (a pytree's fields have no class attribute)
  if attr in getattr(obj, '__dataclass_fields__', {}):
    return obj.__dataclass_fields__[attr]
  return getattr(obj, attr)

failures = []
for check in checks:
  try:
    if 'homes' in check:
      for home in check['homes']:
        try:
          obj = within(resolve(home), check['name'])
          break
        except (ImportError, AttributeError):
          continue
      else:
        raise AttributeError(f"not an attribute of any of {check['homes']}")
    else:
      obj = resolve(check['name'])
    known = parameters(obj)
    unknown = sorted(set(check['keywords']) - known) if known is not None else []
    if unknown:
      raise TypeError(f'no parameters {unknown}')
  except Exception as e:
    failures.append(f"{check['name']!r}: {type(e).__name__}: {e} (in: {check['block']})")
print(json.dumps(failures))
'''


def unresolved(checks: list[dict]) -> list[str]:
  done = subprocess.run([sys.executable, '-c', RESOLVE], input=json.dumps(checks), cwd=ROOT,
                        capture_output=True, text=True, timeout=300,
                        env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert done.returncode == 0, done.stderr
  return json.loads(done.stdout)


def test_every_cited_path_and_name_exists():
  with open(DESIGN, encoding='utf-8') as f:
    missing, checks = citations(f.read())
  assert len(checks) > 40, f'the parser found only {len(checks)} names in docs/design.md'
  failures = [f'no file {m}' for m in missing] + unresolved(checks)
  assert not failures, 'docs/design.md cites what does not exist:\n' + '\n'.join(failures)


def test_a_renamed_module_or_name_is_found():
  """The check fails on a page that cites a module, a file of the row's
  directory, a name or a keyword that is not there."""
  page = ('| the step | `purax/core/updates.py`, `loss_scales.py` |\n'
          '| models | `purax/nn/` (`NoSuchModel`) |\n'
          '\n- `purax.Task(model, tx, no_such_keyword=...)` and `purax.no_such_name`.\n')
  missing, checks = citations(page)
  assert [m.split(' in:')[0] for m in missing] == ["'purax/core/updates.py'", "'loss_scales.py'"]
  failures = unresolved(checks)
  assert len(failures) == 3, failures
  assert any("'NoSuchModel'" in f for f in failures)
  assert any('no_such_keyword' in f for f in failures)
  assert any("'purax.no_such_name'" in f for f in failures)
