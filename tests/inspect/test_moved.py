"""purax.inspect moved out of purax.core in 0.3: each old import path still
gives the same module (the same objects) with a DeprecationWarning naming the
new one, until 0.4; purax.core.find_nonfinite too."""

import importlib
import sys

import pytest

import purax

MOVED = {'summary': 'summary', 'flops': 'flops', 'nonfinite': 'nan', 'intercept': 'intercept'}


@pytest.mark.parametrize('old, new', sorted(MOVED.items()))
def test_the_old_import_path_is_the_new_module_with_a_warning(old, new, monkeypatch):
  module = importlib.import_module(f'purax.inspect.{new}')
  monkeypatch.delitem(sys.modules, f'purax.core.{old}', raising=False)
  monkeypatch.delitem(vars(importlib.import_module('purax.core')), old, raising=False)
  with pytest.warns(DeprecationWarning, match=rf'purax\.core\.{old} is deprecated: use '
                    rf'purax\.inspect\.{new} \(it goes in 0\.4'):
    alias = importlib.import_module(f'purax.core.{old}')
  assert alias is module
  assert sys.modules[f'purax.core.{old}'] is module


def test_core_find_nonfinite_is_deprecated_for_purax_find_nonfinite():
  with pytest.warns(DeprecationWarning, match=r'use purax\.find_nonfinite'):
    found = purax.core.find_nonfinite
  assert found is purax.find_nonfinite is importlib.import_module('purax.inspect.nan').find


def test_the_step_path_imports_no_inspect_module():
  """core (the step's path) does not import purax.inspect: a Task's step is
  built and run in a fresh process without it."""
  import subprocess
  code = ('import sys, jax, purax\n'
          'from tests.helpers import tiny_batch, tiny_task\n'
          'task = tiny_task("mlp", total_steps=2); b = tiny_batch(seed=0)\n'
          'state = jax.jit(task.init)(jax.random.key(0), b)\n'
          'jax.jit(task.step)(state, b)\n'
          'print(sorted(m for m in sys.modules if m.startswith("purax.inspect")))\n')
  import os
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  done = subprocess.run([sys.executable, '-c', code], cwd=root, capture_output=True, text=True,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'), timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip().splitlines()[-1] == '[]', done.stdout
