"""Fuzzed command-line options and npz contents (issue 13.7): every input ends
in exit 0 with a finite model, or exit 2 with a message naming a field —
never a traceback, never a NaN in a JSON file. Derandomized and bounded."""

import contextlib
import io
import json
import math
import os
import shutil
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from purax.app import cli

BOUNDED = settings(max_examples=10, derandomize=True, deadline=None, database=None,
                   suppress_health_check=list(HealthCheck))

EDGE = {
    '--steps': [1, 2, 0, -1, 2 ** 31, 2 ** 63, 10 ** 30],
    '--batch-size': [1, 4, 0, -3, 2 ** 31, 10 ** 6],
    '--learning-rate': [1e-3, 0.5, 10.0, 0.0, -1.0, 'nan', 'inf', 1e30, 1e-30],
    '--weight-decay': [0.0, 1e-4, 1.0, 'nan', 'inf', -1.0, 1e9],
    '--loss-scale': [1.0, 32768.0, 0.0, 'nan', 'inf', 1e30],
    '--seed': [0, 2 ** 32 - 1, 2 ** 32, -1, 2 ** 64],
    '--num-classes': [4, 1, 2 ** 31, 2 ** 40],
    '--label-smoothing': [0.0, 0.5, 1.0, 'nan', -0.1],
    '--precision': ['fp32', 'bf16', 'fp16', 'garbage'],
    '--microbatches': [1, 2, 3, 0],
    '--clip-norm': [1.0, 0.0, 'inf', 1e-30],
}


def _npz(path, **overrides):
  rng = np.random.default_rng(0)
  arrays = {'x_train': rng.normal(size=(16, 6)).astype(np.float32),
            'y_train': rng.integers(0, 4, 16), 'x_test': rng.normal(size=(4, 6)),
            'y_test': rng.integers(0, 4, 4)}
  arrays.update(overrides)
  np.savez(path, **{k: v for k, v in arrays.items() if v is not None})


def _no_nan(text):
  def refuse(constant):
    raise AssertionError(f'a bare {constant} in JSON')
  return json.loads(text, parse_constant=refuse)


def _run_and_check(args, directory):
  workdir = os.path.join(directory, 'run')
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      status = cli.main(['train', '--model', 'mlp', '--eval-every', '0', '--log-every', '1',
                         '--no-progress', '--workdir', workdir, *map(str, args)])
    except SystemExit as e:      # the option parser (tyro): exit 2 naming the option
      status = e.code
  err = err.getvalue()
  assert status in (0, 2), (status, args, err[-2000:])
  assert 'Traceback' not in err, err[-3000:]
  if status == 2:
    assert ': expected ' in err or 'error' in err.lower(), (args, err[-2000:])
    return status
  final = _no_nan(open(os.path.join(workdir, 'final_metrics.json')).read())
  assert all(math.isfinite(v) for v in final.values() if isinstance(v, float)), final
  for line in open(os.path.join(workdir, 'metrics.jsonl')):
    _no_nan(line)
  return status


@BOUNDED
@given(st.dictionaries(st.sampled_from(sorted(EDGE)), st.none(), min_size=1, max_size=3)
       .flatmap(lambda keys: st.fixed_dictionaries(
           {k: st.sampled_from(EDGE[k]) for k in keys})))
def test_fuzzed_options_exit_0_with_a_finite_model_or_2_naming_a_field(options):
  directory = tempfile.mkdtemp()
  try:
    _npz(os.path.join(directory, 'd.npz'))
    args = ['--dataset', f'npz:{directory}/d.npz', '--steps', '2', '--batch-size', '4']
    for k, v in options.items():
      args += [k, v]
    _run_and_check(args, directory)
  finally:
    shutil.rmtree(directory, ignore_errors=True)


ARRAYS = st.sampled_from([
    ('x_train', np.zeros((16, 0), np.float32)),
    ('x_train', np.full((16, 6), 1e38, np.float64)),
    ('x_train', np.full((16, 6), np.nan)),
    ('x_train', np.ones((16, 6), bool)),
    ('x_train', np.ones((16, 6), np.complex64)),
    ('x_train', np.ones((16, 6), np.int8)),
    ('x_train', np.array([[1.0] * 6] * 16, dtype=object)),
    ('y_train', np.full(16, 2 ** 40)),
    ('y_train', np.full(16, -1)),
    ('y_train', np.zeros(16, np.float32)),
    ('y_train', np.array([0] * 16, dtype=object)),
    ('y_train', np.zeros(15, np.int64)),
    ('x_test', np.zeros((0, 6))),
    ('y_test', None),
    ('num_classes', np.float64(2.5)),
    ('num_classes', np.arange(3)),
    ('num_classes', np.int64(-1)),
    ('num_classes', np.int64(2 ** 40)),
    ('num_classes', np.int64(4)),
])


@settings(BOUNDED, max_examples=20)     # most end before compiling: cheap
@given(st.lists(ARRAYS, min_size=1, max_size=2), st.booleans())
def test_fuzzed_npz_contents_exit_0_with_a_finite_model_or_2_naming_a_field(changes,
                                                                            truncate):
  directory = tempfile.mkdtemp()
  try:
    path = os.path.join(directory, 'd.npz')
    _npz(path, **dict(changes))
    if truncate:
      data = open(path, 'rb').read()
      with open(path, 'wb') as f:
        f.write(data[:len(data) * 2 // 3])
    status = _run_and_check(['--dataset', f'npz:{path}', '--steps', '2', '--batch-size', '4'],
                            directory)
    if status == 2:
      assert not os.path.exists(os.path.join(directory, 'run'))   # nothing written
  finally:
    shutil.rmtree(directory, ignore_errors=True)
