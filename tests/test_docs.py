"""The documentation: `make docs` builds the site with no warning, every
example renders as code and runs, the landing page links the core API.

The site is built once per session (in this process: purax is imported
already) by the ``site`` fixture that the HTML tests share. The docstring
examples run as doctests in this process, in the names
``docs/build.py``'s ``DOCTEST_SETUP`` defines (shown on the API reference's
front page). Every Python block of the pages runs on its own in a fresh
interpreter (:func:`block_runs`): as a reader copies it, with nothing before
it but the block it says in words it continues ("Continuing the block
above"). ``purax`` lines of the pages' bash blocks are parsed and validated
as the README's are.
"""

import contextlib
import doctest
import glob
import importlib
import importlib.util
import io
import logging
import os
import re
import subprocess
import sys
import tempfile
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, 'docs')
PAGES = sorted(glob.glob(os.path.join(DOCS, '*.md')) + glob.glob(os.path.join(DOCS, 'guides', '*.md')))


def _load_build():
  spec = importlib.util.spec_from_file_location('purax_docs_build', os.path.join(DOCS, 'build.py'))
  build = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(build)
  return build


def doctest_globals() -> dict:
  """The names the docstring examples use without defining them
  (``docs/build.py``'s ``DOCTEST_SETUP``)."""
  scope: dict = {}
  exec(compile(_load_build().DOCTEST_SETUP, 'DOCTEST_SETUP', 'exec'), scope)
  return scope


def blocks(path: str, language: str) -> list[str]:
  with open(path, encoding='utf-8') as f:
    return re.findall(rf'^```{language}\n(.*?)^```', f.read(), re.S | re.M)


#: The words before a Python block that make it continue the Python block above it.
CONTINUES = re.compile(r'continuing the block above', re.I)
#: The words before a block that tell the reader to start Python with host devices.
DEVICES = re.compile(r'--xla_force_host_platform_device_count=(\d+)')


def block_runs(path: str) -> list[tuple[str, str, int]]:
  """``(name, source, devices)`` of each run of a page's Python blocks.

  A block runs alone, or after the blocks it continues: one that says
  "Continuing the block above" in the prose since the Python block before it
  runs concatenated with that one (which then is not run alone as well: its
  run is the chain's beginning). ``devices``: the host device count the prose
  before a block of the run tells the reader to set (1 otherwise).
  """
  with open(path, encoding='utf-8') as f:
    text = f.read()
  found, last = [], 0
  for m in re.finditer(r'^```python\n(.*?)^```', text, re.S | re.M):
    found.append((text[last:m.start()], m.group(1)))
    last = m.end()
  runs: list[tuple[list[int], str, int]] = []
  for i, (prose, source) in enumerate(found):
    devices = int(max(DEVICES.findall(prose), key=int, default=1))
    if CONTINUES.search(prose):
      assert runs, f'{path}: block 1 continues no block'
      chain, previous, n = runs.pop()
      runs.append((chain + [i + 1], previous + source, max(n, devices)))
    else:
      runs.append(([i + 1], source, devices))
  return [('block' + '+'.join(map(str, chain)), source, devices)
          for chain, source, devices in runs]


@pytest.fixture(scope='module')
def site(tmp_path_factory):
  build = _load_build()
  out = tmp_path_factory.mktemp('site') / 'html'
  with warnings.catch_warnings(record=True):   # libraries' import-time warnings
    warnings.simplefilter('always')
    problems = build.build(str(out))
  return build, str(out), problems


def _html(out: str, rel: str) -> str:
  with open(os.path.join(out, rel), encoding='utf-8') as f:
    return f.read()


def _pre_blocks(text: str) -> list[str]:
  import html
  return [re.sub(r'\s+', ' ', html.unescape(re.sub(r'<[^>]+>', '', m))).strip()
          for m in re.findall(r'<pre[^>]*>(.*?)</pre>', text, re.S)]


def test_site_builds_and_every_docstring_example_is_a_code_block(site):
  build, out, problems = site
  assert problems == []
  examples = build.docstring_examples()
  assert len(examples) >= 15, sorted(examples)        # modules with >>> examples
  assert {'purax.core.task', 'purax.loop', 'purax.resume', 'purax.hooks.library',
          'purax.testing'} <= set(examples)
  for module, sources in examples.items():
    page = _html(out, os.path.join('api', build.page_of(module) + '.html'))
    pre = ' | '.join(_pre_blocks(page))
    for source in sources:
      first = re.sub(r'\s+', ' ', source.splitlines()[0]).strip()
      assert f'>>> {first}' in pre, (module, first)    # with its prompt, inside <pre>
    assert 'Example::' not in page


def test_landing_page_links_the_core_api_and_every_guide(site):
  _, out, _ = site
  index = _html(out, 'index.html')
  hrefs = set(re.findall(r'href="([^"]+)"', index))
  for target in ('purax.core.task.Task', 'purax.loop.fit', 'purax.core.state.TrainState',
                 'purax.resume.restore_or_init', 'module-purax.testing'):
    assert any(h.endswith('#' + target) for h in hrefs), target
  for page in glob.glob(os.path.join(DOCS, 'guides', '*.md')):
    name = os.path.basename(page)[:-3]
    assert f'guides/{name}.html' in hrefs, name          # listed on the landing page
    assert os.path.isfile(os.path.join(out, 'guides', name + '.html'))
  # In the reading order docs/index.md gives them, not by name.
  with open(os.path.join(DOCS, 'index.md'), encoding='utf-8') as f:
    listed = re.findall(r'^guides/([a-z-]+)$', f.read(), re.M)
  shown = list(dict.fromkeys(re.findall(r'href="guides/([a-z-]+)\.html"', index)))
  assert shown == listed, (shown, listed)
  assert len(listed) == len(glob.glob(os.path.join(DOCS, 'guides', '*.md')))
  assert _pre_blocks(index), 'the landing page example is not a code block'


def test_a_problem_fails_the_build_and_keeps_the_previous_site(tmp_path, monkeypatch):
  build = _load_build()
  import sphinx.application

  class Warns:
    def __init__(self, srcdir, confdir, outdir, doctreedir, builder, *, warning, **_):
      self.warning, self.outdir = warning, outdir

    def build(self):
      self.warning.write('docs/guides/x.md:3: WARNING: py:func reference target not found: nope\n')
      os.makedirs(self.outdir, exist_ok=True)

  monkeypatch.setattr(sphinx.application, 'Sphinx', Warns)
  monkeypatch.setattr(build, 'stage', lambda staging: None)
  (tmp_path / 'html').mkdir()
  (tmp_path / 'html' / build.MARKER).write_text('')
  (tmp_path / 'html' / 'old.html').write_text('previous build')
  assert build.main([str(tmp_path / 'html')]) == 1
  assert (tmp_path / 'html' / 'old.html').read_text() == 'previous build'
  assert not (tmp_path / 'html.tmp').exists()


def _tree(root):
  """``relative path -> bytes`` (a directory: None) of everything under ``root``."""
  out = {}
  for dirpath, dirs, files in os.walk(root):
    for name in dirs:
      out[os.path.relpath(os.path.join(dirpath, name), root)] = None
    for name in files:
      with open(os.path.join(dirpath, name), 'rb') as f:
        out[os.path.relpath(os.path.join(dirpath, name), root)] = f.read()
  return out


@pytest.mark.parametrize('which', ['out', 'tmp'])
def test_a_directory_it_did_not_build_is_refused_and_left_untouched(which, tmp_path, monkeypatch,
                                                                     capsys):
  """An existing OUT (or OUT.tmp) without the marker is refused before any
  work (nothing staged, Sphinx never started): one line naming it, exit 2,
  every byte as it was."""
  build = _load_build()
  monkeypatch.setattr(build, 'stage', lambda staging: pytest.fail('staged'))
  out = tmp_path / 'html'
  mine = out if which == 'out' else tmp_path / 'html.tmp'
  (mine / 'notes').mkdir(parents=True)
  (mine / 'index.html').write_bytes(b'my own page\x00\xff')
  (mine / 'notes' / 'a.txt').write_bytes(b'keep me')
  before = _tree(tmp_path)
  assert build.main([str(out)]) == 2
  err = capsys.readouterr().err.splitlines()
  assert err == [f'docs: {mine}: expected no such path or a site built by docs/build.py (a '
                 f'directory holding {build.MARKER}), got a directory of 2 entries without '
                 f'{build.MARKER}; left untouched (remove it or choose another OUT)'], err
  assert _tree(tmp_path) == before


def test_a_file_or_a_link_at_out_is_refused(tmp_path, monkeypatch, capsys):
  build = _load_build()
  monkeypatch.setattr(build, 'stage', lambda staging: pytest.fail('staged'))
  site = tmp_path / 'site'
  site.mkdir()
  (site / build.MARKER).write_text('')
  (tmp_path / 'link').symlink_to(site)
  (tmp_path / 'file').write_bytes(b'data')
  before = _tree(tmp_path)
  assert build.main([str(tmp_path / 'file')]) == 2
  assert 'got a file;' in capsys.readouterr().err
  assert build.main([str(tmp_path / 'link')]) == 2
  assert f'got a symlink to {str(site)!r};' in capsys.readouterr().err
  assert _tree(tmp_path) == before


def test_its_own_site_and_leftover_are_replaced(tmp_path, monkeypatch):
  """A previous site (marker) is replaced by the new one, which holds the
  marker; a leftover OUT.tmp of a killed build (marker) is removed first."""
  build = _load_build()
  import sphinx.application

  class Builds:
    def __init__(self, srcdir, confdir, outdir, doctreedir, builder, **_):
      self.outdir = outdir

    def build(self):
      with open(os.path.join(self.outdir, 'index.html'), 'w') as f:
        f.write('<article><pre>new</pre></article>')

  monkeypatch.setattr(sphinx.application, 'Sphinx', Builds)
  monkeypatch.setattr(build, 'stage', lambda staging: None)
  monkeypatch.setattr(build, 'docstring_examples', lambda: {})
  for name in ('html', 'html.tmp'):
    (tmp_path / name).mkdir()
    (tmp_path / name / build.MARKER).write_text('')
    (tmp_path / name / 'old.html').write_text('old')
  assert build.main([str(tmp_path / 'html')]) == 0
  assert sorted(os.listdir(tmp_path)) == ['html']
  assert sorted(os.listdir(tmp_path / 'html')) == sorted([build.MARKER, 'index.html'])


def test_code_rendered_as_prose_is_a_problem(tmp_path, monkeypatch):
  build = _load_build()
  page = tmp_path / 'guides' / 'x.html'
  page.parent.mkdir()
  page.write_text('<article><p>Example::</p><p>&gt;&gt;&gt; task = Task()</p>'
                  '<pre>ok = 1</pre></article>')
  monkeypatch.setattr(build, 'docstring_examples', lambda: {})
  problems = build.check_html(str(tmp_path))
  assert len(problems) == 2 and all('rendered as prose' in p for p in problems), problems


def test_every_docstring_example_runs(tmp_path, monkeypatch):
  """Every ``>>>`` example of purax's docstrings, as a doctest in the names of
  ``DOCTEST_SETUP``."""
  build = _load_build()
  _write_under(tmp_path, monkeypatch)
  monkeypatch.setenv('WANDB_MODE', 'disabled')
  scope = doctest_globals()
  finder = doctest.DocTestFinder(exclude_empty=True)
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  out, ran = io.StringIO(), 0
  # The examples show results, not fit's log lines: those are silenced the way
  # the docs tell users to (where they go otherwise depends on the logging
  # other tests of this process set up).
  logger = logging.getLogger('purax')
  level = logger.level
  logger.setLevel(logging.WARNING)
  try:
    for name in build.modules():
      for test in finder.find(importlib.import_module(name), name, globs=dict(scope)):
        if test.examples:
          with user_code():
            runner.run(test, out=out.write)
          ran += 1
  finally:
    logger.setLevel(level)
  assert ran >= 20
  assert runner.failures == 0, out.getvalue()[-6000:]


BLOCK_RUNS = [(os.path.relpath(p, DOCS), *run) for p in PAGES for run in block_runs(p)]


@pytest.mark.parametrize('page,name,source,devices', BLOCK_RUNS,
                         ids=[f'{page}:{name}' for page, name, _, _ in BLOCK_RUNS])
def test_every_python_block_of_the_pages_runs_alone(page, name, source, devices, tmp_path):
  """A page's Python block (or the chain it continues) in a fresh interpreter:
  this checkout's purax, CPU, the XLA flags of the suite's child processes
  and the device count the page names; its files land under ``tmp_path``
  (the working directory and the temporary directory)."""
  if page == os.path.join('guides', 'cli.md'):      # what the page says exists: an export
    _export_digits_predict(tmp_path / 'runs' / 'mine' / 'export')
  env = dict(os.environ, JAX_PLATFORMS='cpu', WANDB_MODE='disabled', TMPDIR=str(tmp_path),
             PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  if page == os.path.join('guides', 'from-cli-to-python.md'):   # the run its command trains
    (command,) = re.findall(r'```bash\n(purax train .*?)\n```', open(os.path.join(DOCS, page)).read())
    child = dict(env, XLA_FLAGS=os.environ.get('PURAX_TEST_CHILD_XLA_FLAGS', ''))
    trained = subprocess.run([sys.executable, '-m', 'purax', *command.split()[1:], '--no-progress'],
                             cwd=tmp_path, env=child, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
  env['XLA_FLAGS'] = (os.environ.get('PURAX_TEST_CHILD_XLA_FLAGS', '')
                      + (f' --xla_force_host_platform_device_count={devices}'
                         if devices > 1 else '')).strip()
  done = subprocess.run([sys.executable, '-c', source], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, f'docs/{page} {name}:\n{done.stderr[-3000:]}'
  if page == 'index.md':                             # the landing page's claim
    assert float(done.stdout.split()[-1]) > 0.9, done.stdout[-500:]


def _write_under(tmp_path, monkeypatch) -> None:
  """What the examples write lands under ``tmp_path``: their relative paths
  (the working directory) and their ``tempfile.mkdtemp()`` directories (the
  system's temporary directory would keep them after the suite)."""
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))


@contextlib.contextmanager
def user_code():
  """What a user's session has: jax's default rank promotion (this suite
  raises on it, to keep purax's own code explicit)."""
  import jax
  with jax.numpy_rank_promotion('allow'):
    yield


def _export_digits_predict(directory):
  """What ``purax export`` of a digits run writes (here of a fresh MLP)."""
  import jax
  import optax
  import numpy as np
  import purax
  from purax.io.export import export_predict
  task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10), tx=optax.sgd(0.1))
  batch = {'x': np.zeros((2, 8, 8, 1), np.float32), 'y': np.zeros(2, np.int32)}
  state = task.init(jax.random.key(0), batch)
  export_predict(lambda x: task.predict(state, {'x': x}), (8, 8, 1), str(directory))


def test_every_purax_command_of_the_pages_parses_and_validates():
  from tests.helpers_cli import validate_commands
  from purax.app import cli
  commands = []
  for page in PAGES:
    commands += commands_of(page)
  assert len(commands) >= 30
  assert validate_commands(commands, where='docs') == {      # every subcommand shown
      'train', 'eval', 'export', 'sweep', 'generate', 'plot', 'tune', 'debug-nan'}
  import shlex
  in_docstring = [shlex.split(line, comments=True)[1:] for line in cli.__doc__.splitlines()
                  if line.strip().startswith('purax ')]
  assert len(in_docstring) >= 10
  validate_commands(in_docstring, where='purax.app.cli')


def commands_of(path: str) -> list[list[str]]:
  import shlex
  out = []
  for block in blocks(path, 'bash'):
    for line in block.replace('\\\n', ' ').splitlines():
      words = shlex.split(line, comments=True)
      if words[:1] == ['purax']:
        out.append(words[1:])
  return out
