"""Multi-host on jax.distributed: two local processes x 2 CPU devices (gloo)
train like one process with 4 devices; initialize() argument handling."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from purax import ConfigError, parallel, testing
from tests.parallel import multiprocess_worker as worker

TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def test_two_processes_equal_one_process_with_four_devices(tmp_path):
  out = tmp_path / 'params.npz'
  port = _free_port()
  env = {k: v for k, v in os.environ.items()
         if not k.lower().endswith('_proxy') and not k.startswith(('PURAX_', 'JAX_'))}
  env['PYTHONPATH'] = os.getcwd() + os.pathsep + env.get('PYTHONPATH', '')
  procs = [subprocess.Popen([sys.executable, worker.__file__, str(i), '2', str(port), str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
           for i in range(2)]
  try:
    logs = [p.communicate(timeout=TIMEOUT_S)[0].decode() for p in procs]
  finally:
    for p in procs:          # always clean up, whatever happened
      if p.poll() is None:
        p.kill()
        p.wait()
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-3000:]
  got = dict(np.load(out))
  # The same program on one process with 4 of this process's 8 devices.
  mesh = parallel.make_mesh(data=2, fsdp=-1, devices=jax.devices()[:4])
  with jax.default_matmul_precision('highest'):
    expected = worker.train(mesh, parallel.fsdp(min_size=64), distributed=False)
  expected = {jax.tree_util.keystr(p): np.asarray(x)
              for p, x in jax.tree_util.tree_leaves_with_path(expected)}
  testing.assert_trees_close(got, expected, testing.TOLERANCES['params'], what='params')


def test_initialize_is_a_no_op_for_one_process(monkeypatch):
  for var in sum(parallel.distributed.ENV.values(), ()):
    monkeypatch.delenv(var, raising=False)
  assert parallel.distributed.initialize() is False
  assert parallel.distributed.initialize(num_processes=1) is False


@pytest.mark.parametrize('kwargs, env, match', [
    (dict(coordinator='nohost', num_processes=2, process_id=0), {},
     r"coordinator \(from argument\): expected 'HOST:PORT', got 'nohost'"),
    (dict(coordinator='h:1', num_processes=2, process_id=2), {},
     r'process_id \(from argument\): expected in \[0, 2\), got 2'),
    (dict(coordinator='h:1'), {'PURAX_NUM_PROCESSES': 'two', 'PURAX_PROCESS_ID': '0'},
     r"num_processes \(from PURAX_NUM_PROCESSES\): expected an integer, got 'two'"),
    (dict(coordinator='h:1', num_processes=2), {},
     r'process_id \(from nowhere: not set\): expected an integer, got None'),
])
def test_initialize_rejects_bad_values_before_connecting(monkeypatch, kwargs, env, match):
  for var in sum(parallel.distributed.ENV.values(), ()):
    monkeypatch.delenv(var, raising=False)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  with pytest.raises(ConfigError, match=match):
    parallel.distributed.initialize(**kwargs)


def test_process_rows_and_global_batch_single_process():
  mesh = parallel.make_mesh(data=4, fsdp=2)
  rules = parallel.data_parallel()
  assert parallel.distributed.process_rows(mesh, rules, 16) == slice(0, 16)
  local = {'x': np.arange(32, dtype=np.float32).reshape(16, 2)}
  out = parallel.distributed.global_batch(local, mesh, rules)
  assert out['x'].shape == (16, 2) and out['x'].sharding.spec[0] == ('data', 'fsdp')
  np.testing.assert_array_equal(np.asarray(out['x']), local['x'])
