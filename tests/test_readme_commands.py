"""README commands and snippets that drifted once: each is run here (tiny settings).

The README's Python API block runs as it is; its ``purax`` lines (and the
docs pages', tests/test_docs.py) parse and validate."""

import os
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from purax.app import cli
from tests.helpers_cli import validate_commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, 'README.md'), encoding='utf-8').read()


CLI_GUIDE = open(os.path.join(ROOT, 'docs', 'guides', 'cli.md'), encoding='utf-8').read()


def python_blocks(text=README):
  return re.findall(r'```python\n(.*?)```', text, re.S)


def run_script(*args, timeout=600):
  env = {k: v for k, v in os.environ.items() if not k.startswith('PURAX_')}
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)


def test_load_predict_snippet_runs_as_written(tmp_path, monkeypatch):
  from purax.io.export import export_predict
  (snippet,) = [b for b in python_blocks(CLI_GUIDE) if 'load_predict' in b]
  export_predict(lambda x: jnp.tile(x.reshape(x.shape[0], -1)[:, :10], 1), (8, 8, 1),
                 str(tmp_path / 'runs' / 'mine' / 'export'))
  monkeypatch.chdir(tmp_path)
  scope = {}
  exec(compile(snippet, 'docs/guides/cli.md', 'exec'), scope)   # x: defined by the snippet
  assert np.asarray(scope['logits']).shape == (5, 10)


@pytest.mark.dtype_promotion('standard')   # the block as a reader runs it: jax's default
def test_python_api_block_runs_as_written(capsys):
  """The README's own model and loss, trained as the block says: it learns."""
  (snippet,) = [b for b in python_blocks() if 'loss_function' in b]
  scope = {}
  exec(compile(snippet, 'README.md', 'exec'), scope)
  assert int(scope['state'].step) == 200
  assert scope['history'][-1]['eval/accuracy'] > 0.9, scope['history'][-1]
  assert 'label_smoothing' in scope['state'].hparams


@pytest.mark.parametrize('command', ['train', 'sweep', 'eval', 'export', 'plot', 'generate',
                                     'tune lr'])
def test_help_states_each_default_once(command, capsys):
  with pytest.raises(SystemExit) as e:
    cli.main([*command.split(), '--help'])
  assert e.value.code == 0
  text = re.sub(r'[│╭╰─╮╯]', ' ', capsys.readouterr().out)
  options = re.split(r'\n\s*(?=--)', text)     # one chunk per option
  for option in options:
    assert len(re.findall(r'\(default', option)) <= 1, option


def test_collectives_benchmark_help():
  out = run_script('benchmarks/collectives.py', '--help')
  assert out.returncode == 0, out.stderr[-2000:]
  assert '--out' in out.stdout


def test_checkpoint_benchmark_makes_the_100m_save_opt_in():
  out = run_script('benchmarks/checkpoint.py', '--help')
  assert out.returncode == 0, out.stderr[-2000:]
  assert '--big' in out.stdout


@pytest.mark.slow
def test_memory_benchmark_with_a_batch_that_16_does_not_divide(tmp_path):
  out = run_script('benchmarks/memory.py', '--batch', '8', '--d-model', '16', '--layers', '1',
                   '--heads', '2', '--seq', '8', '--features', '4', '--remat', 'none', '--out',
                   str(tmp_path / 'memory.json'))
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'microbatches [16]: skipped' in out.stdout
  import json
  result = json.loads((tmp_path / 'memory.json').read_text())
  assert sorted(result['accumulation']) == ['1', '4'] and result['accumulation_skipped'] == [16]


def readme_commands(program: str) -> list[list[str]]:
  """Every ``PROGRAM ...`` command line of the README's bash blocks, as argv
  (comments dropped, ``\\`` continuations joined)."""
  import shlex
  commands = []
  for block in re.findall(r'```bash\n(.*?)```', README, re.S):
    for line in block.replace('\\\n', ' ').splitlines():
      words = shlex.split(line, comments=True)
      if words[:1] == [program]:
        commands.append(words[1:])
  return commands


def test_every_purax_command_of_the_readme_parses_and_validates():
  """Each `purax ...` line of the README is accepted by the parser, and a
  train or sweep config passes validation (the rest of the commands are in
  the guides: tests/test_docs.py)."""
  commands = readme_commands('purax')
  assert len(commands) >= 10
  assert validate_commands(commands, 'README') == {
      'train', 'eval', 'export', 'sweep', 'generate', 'plot', 'tune', 'debug-nan'}


def test_readme_links_every_guide():
  """The README's guide list links every page of docs/guides/ (the site's
  landing page lists them: tests/test_docs.py), each to a file that exists."""
  import glob
  guides = {os.path.relpath(p, ROOT)
            for p in glob.glob(os.path.join(ROOT, 'docs', 'guides', '*.md'))}
  linked = set(re.findall(r'\]\((docs/[a-z/-]+\.md)\)', README))
  assert len(guides) >= 15
  assert guides <= linked, sorted(guides - linked)
  assert all(os.path.isfile(os.path.join(ROOT, p)) for p in linked), sorted(linked)


def test_every_benchmark_and_make_target_the_readme_names_exists_and_parses():
  """Each `benchmarks/X.py` the README and benchmarks/README.md name answers
  --help; each `make T` is a target of the Makefile; the `tensorboard` it
  tells to run is installed."""
  import shutil
  with open(os.path.join(ROOT, 'benchmarks', 'README.md'), encoding='utf-8') as f:
    both = README + f.read()
  scripts = sorted(set(re.findall(r'benchmarks/([a-z_]+\.py)', both)))
  assert len(scripts) >= 7
  # One process runs each script as __main__ with --help (importing jax once,
  # not once a script); each must exit 0 having printed its usage.
  probe = (
      'import contextlib, io, runpy, sys\nsys.path.insert(0, "benchmarks")\n'
      'for script in sys.argv[1:]:\n'
      '  sys.argv, out = [script, "--help"], io.StringIO()\n'
      '  try:\n'
      '    with contextlib.redirect_stdout(out):\n'
      '      runpy.run_path(script, run_name="__main__")\n'
      '    code = "returned"\n'
      '  except SystemExit as e:\n'
      '    code = e.code\n'
      '  print(script, code, "usage:" in out.getvalue(), flush=True)\n')
  out = run_script('-c', probe, *[f'benchmarks/{s}' for s in scripts], timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  answers = dict(line.split(' ', 1) for line in out.stdout.splitlines())
  assert answers == {f'benchmarks/{s}': '0 True' for s in scripts}, (answers, out.stderr[-2000:])
  assert os.path.isfile(os.path.join(ROOT, 'benchmarks', 'gpu.sh'))
  makefile = open(os.path.join(ROOT, 'Makefile'), encoding='utf-8').read()
  targets = set(re.findall(r'^([a-z]+):', makefile, re.M))
  assert set(re.findall(r'\bmake ([a-z]+)\b', README)) <= targets
  if 'tensorboard --logdir' in README:
    assert shutil.which('tensorboard', path=os.path.dirname(sys.executable))
