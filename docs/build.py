"""Builds the documentation site (HTML, Sphinx + MyST) and fails on any warning.

  python docs/build.py [OUT]          # default docs/_build/html; `make docs` runs this

The site is the landing page (``docs/index.md``), every guide
(``docs/guides/*.md``, listed in reading order on the landing page: a page
in no list is a warning, so an error), the about page, and the API
reference: one page per module of ``purax``, generated here from the
docstrings (autodoc imports every module, so the ``cli``, ``data`` and
``testing`` extras must be installed).

A problem is an error: any Sphinx warning (a docstring that does not parse,
a Markdown link to nothing, a code block that does not lex, a reference
that resolves to nothing: ``nitpicky``), and, checked in the HTML after the
build, a code example that did not come out as code — a docstring example
(every ``>>>`` example of every module) missing from the ``<pre>`` blocks of
its module's page, a paragraph holding ``>>>``, a Markdown fence or a reST
``::`` marker. The script prints each and exits 1, leaving the previous
output in place (the new one is built next to it and renamed in only on
success).

Only a site this script built is replaced: each holds the marker file
:data:`MARKER`, written into ``OUT.tmp`` before Sphinx starts (so a build
killed midway leaves a ``OUT.tmp`` that is recognised as its own). An
existing ``OUT`` or ``OUT.tmp`` without it (any other directory, a file, a
symlink) is refused before any work, with one line on stderr naming it,
exit status 2, and is left untouched.
"""

from __future__ import annotations

import doctest
import html
import importlib
import inspect
import io
import os
import pkgutil
import re
import shutil
import sys
import tempfile
import warnings

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)

#: The file every site built here holds; only a directory holding it is replaced.
MARKER = '.purax-docs-site'


class NotASite(Exception):
  """``OUT`` or ``OUT.tmp`` exists and is not a site this script built."""


def _what(path: str) -> str:
  if os.path.islink(path):
    return f'a symlink to {os.readlink(path)!r}'
  if not os.path.isdir(path):
    return 'a file' if os.path.isfile(path) else 'not a directory'
  n = len(os.listdir(path))
  return f'a directory of {n} {"entry" if n == 1 else "entries"} without {MARKER}'


def check_out(out: str) -> None:
  """Refuses to replace what this script did not build: ``out`` and
  ``out.tmp`` must each be absent or a directory (not a symlink) holding
  :data:`MARKER` as a regular file. Reads only.

  Raises:
    NotASite: naming the path, what was expected and what is there.
  """
  for path in (out.rstrip('/') or out, out.rstrip('/') + '.tmp'):
    if not os.path.lexists(path):
      continue
    marker = os.path.join(path, MARKER)
    if (os.path.isdir(path) and not os.path.islink(path) and os.path.isfile(marker)
        and not os.path.islink(marker)):
      continue
    raise NotASite(f'{path}: expected no such path or a site built by docs/build.py (a '
                   f'directory holding {MARKER}), got {_what(path)}; left untouched '
                   '(remove it or choose another OUT)')


#: Modules with no page of their own (``python -m purax``).
SKIP = ('purax.__main__',)


def modules() -> list[str]:
  """Every public module of purax, packages first, in name order."""
  sys.path.insert(0, ROOT)
  import purax
  names = ['purax'] + [m.name for m in pkgutil.walk_packages(purax.__path__, 'purax.')]
  return sorted((n for n in names if n not in SKIP and not _moved(n) and not any(
      p.startswith('_') for p in n.split('.'))), key=lambda n: n.split('.'))


def _moved(name: str) -> bool:
  """Whether module ``name`` is the old path of a moved one (an alias that
  :func:`purax.core.lazy.moved` binds to its new module, documented there)."""
  if name in sys.modules:
    return sys.modules[name].__name__ != name
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    return importlib.import_module(name).__name__ != name


def reexports(name: str) -> list[tuple[str, str]]:
  """``(public name, where it is defined)`` for what package ``name`` imports
  from its submodules (``purax.Task`` -> ``purax.core.task.Task``)."""
  module = importlib.import_module(name)
  if not hasattr(module, '__path__'):
    return []           # a module's own imports are not its API
  found = []
  for attr, obj in [(a, getattr(module, a)) for a in dir(module)]:
    if attr.startswith('_') or inspect.ismodule(obj):
      continue
    where = getattr(obj, '__module__', None)
    if (where and where.startswith('purax') and where != name
        and getattr(obj, '__qualname__', attr) == attr
        and (inspect.isclass(obj) or inspect.isfunction(obj))):
      found.append((attr, f'{where}.{attr}'))
  return found


def _summary(target: str) -> str:
  module, attr = target.rsplit('.', 1)
  doc = inspect.getdoc(getattr(importlib.import_module(module), attr)) or ''
  first = doc.strip().split('\n\n')[0].replace('\n', ' ')
  return first


def page_of(name: str) -> str:
  """The API page that documents module ``name``: each package and each
  top-level module has one (``purax.core``, ``purax.loop``); a package's
  modules are sections of its page."""
  module = importlib.import_module(name)
  if hasattr(module, '__path__') or name.count('.') <= 1:
    return name
  return name.rsplit('.', 1)[0]


def _heading(text: str, char: str) -> list[str]:
  return [text, char * len(text), '']


def _names_table(name: str) -> list[str]:
  module = importlib.import_module(name)
  names = reexports(name)
  if not names:
    return []
  lines = ['.. rubric:: Names', '', f'Defined in its modules, importable as ``{name}.NAME``:', '',
           '.. list-table::', '   :widths: 30 70', '']
  for attr, target in names:
    role = 'class' if inspect.isclass(getattr(module, attr)) else 'func'
    lines += [f'   * - :py:{role}:`{attr} <{target}>`', f'     - {_summary(target)}']
  return lines + ['']


def api_page(page: str, members: list[str]) -> str:
  """The reST source of one API page: ``page``'s docstring and names, then
  each module of ``members`` (``page``'s own modules) as a section."""
  lines = _heading(page, '=') + [f'.. automodule:: {page}', ''] + _names_table(page)
  for name in members:
    if name != page:
      lines += _heading(name, '-') + [f'.. automodule:: {name}', '']
  return '\n'.join(lines)


def pages() -> dict[str, list[str]]:
  """API page -> the modules it documents, in name order."""
  out: dict[str, list[str]] = {}
  for name in modules():
    out.setdefault(page_of(name), []).append(name)
  return out


#: What the docstring examples assume: the names they use without defining
#: them. ``tests/test_docs.py`` runs the examples as doctests in these names;
#: the API reference's front page shows them. (The guides' blocks need none:
#: each carries its own imports and data.)
DOCTEST_SETUP = """\
import jax
import jax.numpy as jnp
import numpy as np
import optax

import purax
from purax import parallel

rng = np.random.default_rng(0)
x = rng.random((64, 8, 8, 1), dtype=np.float32)                 # 64 images [8, 8, 1]
batch = {'x': x, 'y': (x.sum((1, 2, 3)) > 32).astype(np.int32)}    # labels [64], int32
batches = [batch] * 20                                           # a data set: 20 steps
test = [batch]                                                   # evaluation batches
"""


#: The API pages in reading order (the rest follow by name).
ORDER = ('purax', 'purax.core', 'purax.nn', 'purax.loop', 'purax.resume', 'purax.hooks',
         'purax.plan', 'purax.parallel', 'purax.io', 'purax.io.checkpoint', 'purax.testing',
         'purax.app')


def api_index(names: list[str]) -> str:
  """The API reference's front page: what the examples assume, then the pages."""
  ordered = [n for n in ORDER if n in names] + sorted(set(names) - set(ORDER))
  lines = _heading('API reference', '=') + [
      'One page per package (its modules are sections), generated from the',
      'docstrings. The examples run in the test suite',
      '(``tests/test_docs.py``) as doctests after this code, which defines the',
      'names they use without defining them (``batch``, ``batches``, ``test``):', '',
      '.. code-block:: python', ''] + ['   ' + line if line else ''
                                      for line in DOCTEST_SETUP.splitlines()] + [
      '',
      '.. toctree::', '   :maxdepth: 1', ''] + [f'   {n}' for n in ordered]
  return '\n'.join(lines) + '\n'


def stage(staging: str) -> None:
  """The site's sources in ``staging``: the pages of ``docs/`` and the generated API."""
  for entry in os.listdir(DOCS):
    src = os.path.join(DOCS, entry)
    if entry.startswith(('_', '.')) or entry in ('api', 'build.py', '__pycache__'):
      continue
    if os.path.isdir(src):
      shutil.copytree(src, os.path.join(staging, entry),
                      ignore=shutil.ignore_patterns('__pycache__', '.*'))
    else:
      shutil.copy(src, os.path.join(staging, entry))
  api = os.path.join(staging, 'api')
  os.makedirs(api)
  for page, members in pages().items():
    with open(os.path.join(api, f'{page}.rst'), 'w', encoding='utf-8') as f:
      f.write(api_page(page, members))
  with open(os.path.join(api, 'index.rst'), 'w', encoding='utf-8') as f:
    f.write(api_index(list(pages())))


def docstring_examples() -> dict[str, list[str]]:
  """Module name -> the source of each ``>>>`` example in its docstrings
  (what :func:`check_html` looks for on the module's page)."""
  parser, finder = doctest.DocTestParser(), doctest.DocTestFinder(exclude_empty=True)
  found: dict[str, list[str]] = {}
  for name in modules():
    module = importlib.import_module(name)
    for test in finder.find(module, name):   # the module's own objects, not its imports
      found.setdefault(name, []).extend(
          e.source for e in parser.get_examples(test.docstring or ''))
  return found


def _norm(text: str) -> str:
  """``text`` without doctest prompts, its whitespace runs as one space."""
  lines = [re.sub(r'^\s*(>>>|\.\.\.)( |$)', '', line) for line in text.splitlines()]
  return re.sub(r'\s+', ' ', '\n'.join(lines)).strip()


def _texts(html_text: str, tag: str) -> list[str]:
  """The text of every ``<tag ...>...</tag>`` element of ``html_text`` (not nested)."""
  return [html.unescape(re.sub(r'<[^>]+>', '', m)) for m in
          re.findall(rf'<{tag}(?:\s[^>]*)?>(.*?)</{tag}>', html_text, re.S)]


def check_html(out: str) -> list[str]:
  """What did not render as code in the built site ``out``."""
  problems = []
  pages: dict[str, str] = {}
  for dirpath, _, files in os.walk(out):
    for file in files:
      if file.endswith('.html') and not dirpath.startswith(os.path.join(out, '_')):
        with open(os.path.join(dirpath, file), encoding='utf-8') as f:
          pages[os.path.relpath(os.path.join(dirpath, file), out)] = f.read()
  for rel, text in sorted(pages.items()):
    body = text.split('<article', 1)[-1]
    # Inline code is taken out first: ``>>>`` in a sentence is not code as prose.
    for para in _texts(re.sub(r'<code[^>]*>.*?</code>', '', body, flags=re.S), 'p'):
      if '>>>' in para or '```' in para or re.search(r'::\s*$', para):
        problems.append(f'{rel}: code rendered as prose: {para[:120]!r}')
  for name, examples in docstring_examples().items():
    rel = os.path.join('api', f'{page_of(name)}.html')
    blocks = ' \n '.join(_norm(pre) for pre in _texts(pages.get(rel, ''), 'pre'))
    for source in examples:
      if _norm(source) not in blocks:
        problems.append(f'{rel} ({name}): docstring example not in a code block: '
                        f'{source.strip()[:100]!r}')
  return problems


def build(out: str) -> list[str]:
  """Builds the site into ``out``; returns the problems (none: success).

  Raises:
    NotASite: ``out`` or ``out.tmp`` exists and is not a site built here
      (:func:`check_out`), before any work.
  """
  check_out(out)
  sys.path.insert(0, ROOT)
  from sphinx.application import Sphinx
  from sphinx.util.docutils import docutils_namespace, patch_docutils
  from purax.io.safe_files import write_atomic
  out = out.rstrip('/') or out
  tmp = out + '.tmp'
  shutil.rmtree(tmp, ignore_errors=True)     # our own leftover (check_out)
  os.makedirs(tmp)
  write_atomic(os.path.join(tmp, MARKER), 'A site built by docs/build.py; its next build '
               'replaces this directory.\n')
  with tempfile.TemporaryDirectory(prefix='purax-docs-') as staging:
    stage(staging)
    log = io.StringIO()
    with warnings.catch_warnings(), patch_docutils(staging), docutils_namespace():
      warnings.simplefilter('ignore', DeprecationWarning)   # libraries', at import
      warnings.simplefilter('ignore', PendingDeprecationWarning)
      app = Sphinx(staging, staging, tmp, os.path.join(staging, '.doctrees'), 'html',
                   status=None, warning=log, freshenv=True, keep_going=True)
      app.build()
    problems = [line.replace(staging + os.sep, 'docs/') for line in log.getvalue().splitlines()
                if line.strip()]
  if not problems:
    problems = check_html(tmp)
  if problems:
    shutil.rmtree(tmp, ignore_errors=True)
    return problems
  shutil.rmtree(out, ignore_errors=True)
  os.replace(tmp, out)
  return []


def main(argv: list[str]) -> int:
  out = argv[0] if argv else os.path.join(DOCS, '_build', 'html')
  try:
    problems = build(out)
  except NotASite as e:
    print(f'docs: {e}', file=sys.stderr)
    return 2
  for p in problems:
    print(f'docs: {p}', file=sys.stderr)
  if problems:
    print(f'docs: {len(problems)} problem(s); nothing written to {out}', file=sys.stderr)
    return 1
  print(f'docs: site written to {out}/index.html')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
