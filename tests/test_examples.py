"""Every script in examples/ runs (tiny settings: PURAX_EXAMPLE_TINY=1) and prints its result.

The five scripts start at once in child processes (each imports jax and compiles
its own programs; running them side by side keeps the file's wall time near the
slowest one) with 8 host CPU devices, this checkout first on the path.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / 'examples'
TIMEOUT_S = 600   # a hang fails the test instead of the suite; not a speed assertion

# script -> what its result lines say (one regex per line it must print)
RESULTS = {
    'own_model_contrastive.py': [r'own_model_contrastive: steps \d+, train loss [\d.]+, '
                                 r'test in-batch nn_accuracy [\d.]+, '
                                 r'test 1-NN probe accuracy [\d.]+'],
    'nnx_and_functions.py': [r'nnx_and_functions: steps \d+, NNX loss [\d.]+, '
                             r'functions loss [\d.]+, max \|params difference\| 0, agree True'],
    'sweep_population.py': [r'temperature 0\.3 +lr 0\.01 +test nn_accuracy [\d.]+ \(ok\)',
                            r'sweep_population: best temperature [\d.]+, lr [\d.]+, continued to '
                            r'step \d+: test nn_accuracy [\d.]+'],
    'property_test.py': [r'property_test: my step on meshes of up to 8 CPU devices equals the '
                         r'single-device step'],
    'data_sources.py': [r'data_sources: grain IterDataset: \d+ steps, resumed run bitwise equal',
                        r'data_sources: generator: \d+ steps, resumed run bitwise equal'],
}


@pytest.fixture(scope='module')
def runs(request, tmp_path_factory):
  # Start only the scripts whose tests were selected (``-k``), all at once.
  selected = set()
  for item in request.session.items:
    callspec = getattr(item, 'callspec', None)
    if item.module is request.module and callspec is not None and 'name' in callspec.params:
      selected.add(callspec.params['name'])
  env = {**os.environ, 'PURAX_EXAMPLE_TINY': '1', 'JAX_PLATFORMS': 'cpu',
         'XLA_FLAGS': '--xla_force_host_platform_device_count=8',   # XLA's default -O level
         'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}
  cwd = tmp_path_factory.mktemp('examples')   # nothing a script writes lands in the checkout
  procs = {name: subprocess.Popen([sys.executable, str(EXAMPLES / name)], cwd=cwd, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for name in sorted(selected)}
  yield procs
  for proc in procs.values():   # a failed test may leave its siblings running
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def test_every_example_is_listed_and_at_most_60_lines():
  assert sorted(p.name for p in EXAMPLES.glob('*.py')) == sorted(RESULTS)
  for name in RESULTS:
    lines = len((EXAMPLES / name).read_text().splitlines())
    assert lines <= 60, f'examples/{name}: expected <= 60 lines, got {lines}'


@pytest.mark.xdist_group('examples')   # one worker starts the scripts (make test: --dist loadgroup)
@pytest.mark.parametrize('name', sorted(RESULTS))
def test_example_runs_and_prints_its_result(runs, name):
  try:
    output, _ = runs[name].communicate(timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired:
    runs[name].kill()
    output, _ = runs[name].communicate()
    pytest.fail(f'examples/{name}: expected to finish within {TIMEOUT_S}s, got a timeout:\n'
                f'{output[-3000:]}')
  code = runs[name].returncode
  assert code == 0, f'examples/{name}: expected exit status 0, got {code}:\n{output[-3000:]}'
  for pattern in RESULTS[name]:
    assert re.search(pattern, output), (
        f'examples/{name}: expected a line matching {pattern!r}, got:\n{output[-3000:]}')
