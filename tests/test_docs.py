"""`make docs`: the API reference builds from the docstrings with no warning."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_api_reference_builds_without_warnings(tmp_path):
  out = tmp_path / 'api'
  env = {k: v for k, v in os.environ.items() if not k.startswith('PURAX_')}
  result = subprocess.run([sys.executable, os.path.join(ROOT, 'docs', 'build.py'), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert (out / 'index.html').is_file()
  page = (out / 'purax' / 'core' / 'summary.html').read_text()
  assert 'bytes_per_device' in page and 'Returns' in page     # Google docstrings rendered
  for module in ('loop', 'app/plot', 'app/config', 'io/profile', 'io/writers', 'parallel'):
    assert (out / 'purax' / f'{module}.html').is_file(), module


def test_a_warning_fails_the_build(tmp_path, monkeypatch):
  import importlib.util
  spec = importlib.util.spec_from_file_location('purax_docs_build',
                                                os.path.join(ROOT, 'docs', 'build.py'))
  build = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(build)
  import pdoc

  def warn_and_render(module, output_directory):
    import warnings
    warnings.warn('Error parsing type annotation X for purax.y')
    output_directory.mkdir()

  monkeypatch.setattr(pdoc, 'pdoc', warn_and_render)
  (tmp_path / 'api').mkdir()
  (tmp_path / 'api' / 'old.html').write_text('previous build')
  assert build.main([str(tmp_path / 'api')]) == 1
  assert (tmp_path / 'api' / 'old.html').read_text() == 'previous build'   # left in place
