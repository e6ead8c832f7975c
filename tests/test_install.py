"""The package installs with its core only, and the README's Python API runs so.

Offline and in seconds, without a registry: purax is built and installed with
pip (``--no-deps --no-index --no-build-isolation``) into a directory; a fresh
virtual environment (``--without-pip``) then gets that install plus exactly
the distributions its installed metadata requires, without extras, followed
transitively (``Requires-Dist`` of each, markers evaluated), linked file by
file from the environment running the tests. Nothing else is importable
there, so an optional package imported at the top of a module, or a core
dependency missing from ``install_requires``, fails the example.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTIONAL = ('grain', 'sklearn', 'mnist1d', 'tyro', 'matplotlib', 'tensorboardX', 'tqdm',
            'hypothesis', 'wandb')

# The README's Python API example on numpy batches (no grain, no scikit-learn):
# init, jitted step and evaluate, then fit() over a list of batches.
EXAMPLE = textwrap.dedent("""
  import importlib.util, sys
  import jax, numpy as np
  import purax
  assert purax.__file__.startswith(sys.argv[1]), purax.__file__   # the installed copy
  missing = [m for m in {optional!r} if importlib.util.find_spec(m) is not None]
  assert not missing, f'optional packages present in a core install: {{missing}}'

  rng = np.random.default_rng(0)
  x = rng.random((256, 8, 8, 1), dtype=np.float32)
  y = (x.reshape(256, -1).sum(-1) > 32).astype(np.int32)      # a learnable rule
  task = purax.Task(model=purax.nn.CNN(num_classes=10),
                    tx=purax.adamw(learning_rate=2e-3, total_steps=30, warmup_steps=3))
  batch = {{'x': x[:64], 'y': y[:64]}}
  state = task.init(jax.random.key(0), batch)
  step = jax.jit(task.step, donate_argnums=0)
  evaluate = jax.jit(task.evaluate)
  for _ in range(30):
    state, metrics = step(state, batch)
  print(purax.metrics.compute(metrics))
  print(purax.metrics.compute(evaluate(state, {{'x': x[192:], 'y': y[192:]}})))

  train = [{{'x': x[i:i + 64], 'y': y[i:i + 64]}} for i in (0, 64, 128) * 10]
  test = [{{'x': x[192:], 'y': y[192:]}}]
  state, history = purax.fit(task, task.init(jax.random.key(0), batch), train,
                             hooks=purax.hooks.standard(eval_data=test, log_every=10))
  assert int(state.step) == 30 and 'eval/accuracy' in history[-1], history[-1]
  print('ok')
""").format(optional=OPTIONAL)

def _closure(requirements: list[str]) -> set[str]:
  """Canonical names of the distributions ``requirements`` need, transitively."""
  seen: set[str] = set()
  todo = list(requirements)
  while todo:
    req = Requirement(todo.pop())
    if req.marker is not None and not req.marker.evaluate({'extra': ''}):
      continue
    name = canonicalize_name(req.name)
    if name in seen:
      continue
    seen.add(name)
    todo.extend(md.distribution(name).requires or [])   # not installed: a clear error
  return seen


def _link_distribution(name: str, site: str) -> int:
  dist = md.distribution(name)
  count = 0
  for file in dist.files or ():
    src = os.path.realpath(dist.locate_file(file))
    rel = os.path.normpath(str(file))
    if rel.startswith('..') or os.path.isabs(rel) or not os.path.exists(src):
      continue   # scripts in bin/, or files removed since install
    dst = os.path.join(site, rel)
    if os.path.lexists(dst):
      continue
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.symlink(src, dst)
    count += 1
  return count


@pytest.mark.slow
def test_core_install_runs_the_python_api_example(tmp_path):
  src = tmp_path / 'src'
  src.mkdir()
  for name in ('setup.cfg', 'pyproject.toml', 'README.md'):
    shutil.copy(os.path.join(ROOT, name), src / name)
  shutil.copytree(os.path.join(ROOT, 'purax'), src / 'purax',
                  ignore=shutil.ignore_patterns('__pycache__'))
  target = tmp_path / 'purax-install'
  out = subprocess.run([sys.executable, '-m', 'pip', 'install', '--quiet', '--no-deps',
                        '--no-index', '--no-build-isolation', '--target', str(target), str(src)],
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert (target / 'purax' / 'py.typed').is_file()
  (meta,) = md.distributions(path=[str(target)])
  core = [r for r in meta.requires or [] if 'extra ==' not in r]
  assert {canonicalize_name(Requirement(r).name) for r in core} == {
      'jax', 'flax', 'optax', 'chex', 'orbax-checkpoint', 'numpy'}

  venv = tmp_path / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True,
                 timeout=120)
  python = venv / 'bin' / 'python'
  site = subprocess.run([str(python), '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                        capture_output=True, text=True, check=True).stdout.strip()
  for name in sorted(_closure(core)):
    _link_distribution(name, site)
  with open(os.path.join(site, 'purax-install.pth'), 'w') as f:
    f.write(str(target) + '\n')
  (tmp_path / 'example.py').write_text(EXAMPLE)
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(('PURAX_', 'PYTHON', 'VIRTUAL_ENV'))}
  out = subprocess.run([str(python), str(tmp_path / 'example.py'), str(target)], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert out.stdout.strip().endswith('ok')


def test_extras_name_the_optional_packages():
  """Each optional package is in its extra; `all` holds every extra, `test` all of them."""
  import configparser
  cfg = configparser.ConfigParser()       # setuptools reads setup.cfg with interpolation
  cfg.read(os.path.join(ROOT, 'setup.cfg'))
  extras = {name: {canonicalize_name(Requirement(line).name)
                   for line in value.splitlines() if line.strip()}
            for name, value in cfg['options.extras_require'].items()}
  assert {'tyro', 'tqdm', 'tensorboardx', 'tensorboard', 'matplotlib', 'flatbuffers'} <= extras['cli']
  assert {'grain', 'scikit-learn', 'mnist1d'} <= extras['data']
  assert extras['testing'] == {'hypothesis'}
  assert extras['cli'] | extras['data'] | extras['testing'] == extras['all']
  assert extras['all'] <= extras['test']
