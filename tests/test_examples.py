"""Every script in examples/ runs (tiny settings: PURAX_EXAMPLE_TINY=1) and prints its result.

The scripts start at once in child processes, in one test (each imports jax and compiles
its own programs; running them side by side keeps the file's wall time near the
slowest one) with 8 host CPU devices, this checkout first on the path.
"""

import os
import pathlib
import re
import subprocess
import sys


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
    'frozen_backbone_schedule_free.py': [r'frozen_backbone_schedule_free: steps \d+, backbone '
                                         r'bitwise unchanged True, test accuracy at x [\d.]+'],
    'resume_on_fewer_devices.py': [r'resume_on_fewer_devices: \d+ steps, 8 devices to 4 at step '
                                   r'\d+, max \|params difference\| [\d.e+-]+, refused: '
                                   r'train_data batch size: expected 64'],
    'cli_own_model.py': [r'cli_own_model: mynets:make_net \(loss mynets:focal, data mynets:blobs\) '
                         r'trained to step \d+ after a resume, eval accuracy [\d.]+, exported '
                         r'predict\.jaxexport'],
}

#: Modules the scripts import (not run alone): at most 60 lines too.
MODULES = {'mynets.py'}


def test_every_example_is_listed_and_at_most_60_lines():
  assert sorted(p.name for p in EXAMPLES.glob('*.py')) == sorted({*RESULTS, *MODULES})
  for name in {*RESULTS, *MODULES}:
    lines = len((EXAMPLES / name).read_text().splitlines())
    assert lines <= 60, f'examples/{name}: expected <= 60 lines, got {lines}'


def test_every_example_runs_and_prints_its_result(tmp_path):
  # One test, so one xdist worker starts the scripts (as parametrized tests,
  # each worker that drew one started them all).
  env = {**os.environ, 'PURAX_EXAMPLE_TINY': '1', 'JAX_PLATFORMS': 'cpu',
         'XLA_FLAGS': '--xla_force_host_platform_device_count=8 ' +
                      os.environ.get('PURAX_TEST_CHILD_XLA_FLAGS', ''),
         'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}
  procs = {name: subprocess.Popen([sys.executable, str(EXAMPLES / name)], cwd=tmp_path, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for name in sorted(RESULTS)}   # cwd: nothing a script writes lands in the checkout
  failures = []
  try:
    for name, proc in procs.items():
      try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
      except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        failures.append(f'examples/{name}: expected to finish within {TIMEOUT_S}s, got a '
                        f'timeout:\n{output[-3000:]}')
        continue
      if proc.returncode != 0:
        failures.append(f'examples/{name}: expected exit status 0, got {proc.returncode}:\n'
                        f'{output[-3000:]}')
        continue
      failures += [f'examples/{name}: expected a line matching {pattern!r}, got:\n'
                   f'{output[-3000:]}' for pattern in RESULTS[name]
                   if not re.search(pattern, output)]
  finally:
    for proc in procs.values():   # a failure must not leave scripts running
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  assert not failures, '\n\n'.join(failures)
