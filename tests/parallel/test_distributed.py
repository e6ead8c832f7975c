"""Multi-host on jax.distributed: two local processes x 2 CPU devices (gloo)
train like one process with 4 devices; initialize() argument handling."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

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


TWO_DEVICES = ('--xla_force_host_platform_device_count=2 ' +
               os.environ.get('PURAX_TEST_CHILD_XLA_FLAGS', ''))


def _child_env(**extra) -> dict:
  """This process's environment for a child: no proxies, no PURAX_/JAX_
  settings, the repository importable, plus ``extra``."""
  env = {k: v for k, v in os.environ.items()
         if not k.lower().endswith('_proxy') and not k.startswith(('PURAX_', 'JAX_'))}
  env['PYTHONPATH'] = os.getcwd() + os.pathsep + env.get('PYTHONPATH', '')
  return {**env, **extra}


def _finish(procs) -> list[tuple[int, str]]:
  """``(returncode, output)`` of each process; kills what outlives TIMEOUT_S."""
  try:
    logs = [p.communicate(timeout=TIMEOUT_S)[0].decode() for p in procs]
  finally:
    for p in procs:          # always clean up, whatever happened
      if p.poll() is None:
        p.kill()
        p.wait()
  return [(p.returncode, log) for p, log in zip(procs, logs)]


def test_two_processes_equal_one_process_with_four_devices(tmp_path):
  out = tmp_path / 'params.npz'
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, worker.__file__, str(i), '2', str(port), str(out)],
                            env=_child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
           for i in range(2)]
  for code, log in _finish(procs):
    assert code == 0, log[-3000:]
  got = dict(np.load(out))
  # The same program on one process with 4 of this process's 8 devices.
  mesh = parallel.make_mesh(data=2, fsdp=-1, devices=jax.devices()[:4])
  with jax.default_matmul_precision('highest'):
    expected = worker.train(mesh, parallel.fsdp(min_size=64), distributed=False)
  expected = {jax.tree_util.keystr(p): np.asarray(x)
              for p, x in jax.tree_util.tree_leaves_with_path(expected)}
  testing.assert_trees_close(got, expected, testing.TOLERANCES['params'], what='params')


def _start_two_process_cli(*args) -> list[subprocess.Popen]:
  """Starts ``purax ARGS`` as processes 0 and 1 of a 2-process run (2 CPU devices each)."""
  port = _free_port()
  env = _child_env(XLA_FLAGS=TWO_DEVICES)
  cmd = [sys.executable, '-c', 'import sys; from purax.app.cli import main; sys.exit(main())',
         *args, '--coordinator', f'localhost:{port}', '--num-processes', '2']
  return [subprocess.Popen(cmd + ['--process-id', str(i)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT) for i in range(2)]


def _two_process_cli(*args) -> list[tuple[int, str]]:
  return _finish(_start_two_process_cli(*args))


TRAIN = ('train', '--model', 'mlp', '--dataset', 'digits', '--steps', '20', '--mesh', 'data=4',
         '--checkpoint-every', '10', '--eval-every', '10', '--log-every', '5', '--no-progress')


def test_two_process_cli_run_writes_one_set_of_files(tmp_path):
  # `purax train` on two processes sharing a workdir: process 0 checks it and
  # both learn the answer before either writes; only process 0 writes logs and
  # results (one metrics.jsonl with every record, one event file), and both
  # write their checkpoint shards.
  workdir = tmp_path / 'run'
  for code, log in _two_process_cli(*TRAIN, '--workdir', str(workdir)):
    assert code == 0, log[-3000:]
  rows = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert sorted({r['step'] for r in rows}) == [5, 10, 15, 20], rows
  assert len([r for r in rows if 'eval/accuracy' in r]) == 2
  assert len(list(workdir.glob('events.out.tfevents.*'))) == 1
  assert json.loads((workdir / 'final_metrics.json').read_text())['step'] == 20
  assert sorted(p.name for p in (workdir / 'checkpoints').iterdir()) == ['10', '20']
  shards = {p.name for p in (workdir / 'checkpoints' / '20' / 'state').iterdir()}
  assert {'ocdbt.process_0', 'ocdbt.process_1'} <= shards, shards


def test_two_process_cli_refuses_together_and_writes_nothing(tmp_path):
  # A workdir that is not a purax run: process 0 names the field, process 1
  # names process 0's refusal; both exit at once (no collective left waiting).
  workdir = tmp_path / 'taken'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('mine')
  (code0, log0), (code1, log1) = _two_process_cli(*TRAIN, '--workdir', str(workdir))
  assert code0 == 2 and 'workdir: expected a new or empty directory' in log0, log0[-2000:]
  assert code1 == 2 and 'workdir: expected a directory process 0 accepts' in log1, log1[-2000:]
  assert sorted(p.name for p in workdir.iterdir()) == ['notes.txt']


def test_a_signal_to_one_process_stops_all_at_the_same_step(tmp_path):
  # SIGTERM reaches process 1 only; the processes agree at the next log point,
  # all checkpoint the same step and exit cleanly (none left in a collective).
  workdir = tmp_path / 'run'
  procs = _start_two_process_cli(
      'train', '--model', 'mlp', '--dataset', 'digits', '--steps', '100000', '--mesh', 'data=4',
      '--checkpoint-every', '0', '--eval-every', '0', '--log-every', '5', '--no-progress',
      '--workdir', str(workdir))
  deadline = time.monotonic() + TIMEOUT_S
  metrics = workdir / 'metrics.jsonl'
  while not (metrics.exists() and metrics.read_text().count('\n') >= 2):
    assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
        [p.poll() for p in procs]
    time.sleep(0.2)
  procs[1].send_signal(signal.SIGTERM)
  (code0, log0), (code1, log1) = _finish(procs)
  # The signalled process answers 143; the other stopped with it, resumable, unsignalled: 0.
  assert code0 == 0 and code1 == 143, (log0[-2000:], log1[-2000:])
  steps = [int(re.search(r'stopped by .* at step (\d+);', log).group(1)) for log in (log0, log1)]
  assert 'stopped by a signal to another process' in log0 and 'stopped by SIGTERM' in log1
  assert steps[0] == steps[1] and steps[0] % 5 == 0 and steps[0] < 100000, steps
  assert [p.name for p in (workdir / 'checkpoints').iterdir()] == [str(steps[0])]


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
     r"process_id \(from nowhere: not set\): expected an integer with coordinator='h:1', "
     r'num_processes=2 \(the argument, --process-id or one of PURAX_PROCESS_ID, '
     r'JAX_PROCESS_ID\), got unset'),
    (dict(coordinator='h:1', process_id=0), {},
     r'num_processes \(from nowhere: not set\): expected an integer with .*--num-processes'),
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


@pytest.mark.parametrize('bad, message', [
    (('--dataset', 'npz:/nonexistent.npz'),
     "process 1 cannot start: dataset: expected an existing .npz file, got '/nonexistent.npz'"),
    (('--steps', '21'), 'steps: expected the same value on every process (20 on process 0), '
                        'got 21 on process 1'),
    (('--workdir', 'OTHER'), 'workdir: expected the same value on every process'),
])
def test_a_bad_option_on_one_process_makes_all_exit_together_naming_it(tmp_path, bad,
                                                                         message):
  """Issue 13.5: every process validates, all agree before anything is written,
  and all exit 2 within a bounded time, naming the process and the reason."""
  workdir = tmp_path / 'run'
  bad = tuple(str(tmp_path / 'other') if a == 'OTHER' else a for a in bad)
  port = _free_port()
  env = _child_env(XLA_FLAGS=TWO_DEVICES)
  base = [sys.executable, '-c', 'import sys; from purax.app.cli import main; sys.exit(main())',
          *TRAIN, '--workdir', str(workdir), '--coordinator', f'localhost:{port}',
          '--num-processes', '2']
  start = time.time()
  procs = [subprocess.Popen(base + ['--process-id', str(i), *(bad if i == 1 else ())],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
           for i in range(2)]
  results = _finish(procs)
  elapsed = time.time() - start
  for code, log in results:
    assert code == 2, log[-3000:]
    assert message in log, log[-3000:]
    assert 'Traceback' not in log, log[-3000:]
  assert elapsed < TIMEOUT_S          # both ended: no process left waiting in a collective
  assert not workdir.exists() and not (tmp_path / 'other').exists()


def _free_slurm_job_id() -> int:
  """A SLURM_JOB_ID whose port (jax: id % 4096 + 61440) is free here."""
  for job in range(1000, 5096):
    port = job % 2 ** 12 + (65535 - 2 ** 12 + 1)
    with socket.socket() as s:
      try:
        s.bind(('localhost', port))
        return job
      except OSError:
        continue
  pytest.skip('no free port in the SLURM range')


def test_coordinator_auto_trains_two_processes_from_slurm_variables_alone(tmp_path):
  """`purax train --coordinator auto`: jax's cluster detection reads simulated
  SLURM variables; no address, count or id is given."""
  workdir = tmp_path / 'run'
  job = _free_slurm_job_id()
  cmd = [sys.executable, '-c', 'import sys; from purax.app.cli import main; sys.exit(main())',
         *TRAIN, '--workdir', str(workdir), '--coordinator', 'auto']
  procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_child_env(
      XLA_FLAGS=TWO_DEVICES, SLURM_JOB_ID=str(job),
      SLURM_STEP_NODELIST='localhost', SLURM_NTASKS='2', SLURM_PROCID=str(i),
      SLURM_LOCALID=str(i), SLURM_STEP_NUM_NODES='1')) for i in range(2)]
  for code, log in _finish(procs):
    assert code == 0, log[-3000:]
  assert json.loads((workdir / 'final_metrics.json').read_text())['step'] == 20
  shards = {p.name for p in (workdir / 'checkpoints' / '20' / 'state').iterdir()}
  assert {'ocdbt.process_0', 'ocdbt.process_1'} <= shards, shards


def test_coordinator_auto_outside_a_cluster_is_a_named_error(monkeypatch):
  for var in ('SLURM_JOB_ID', 'OMPI_MCA_orte_hnp_uri', 'KUBERNETES_SERVICE_HOST'):
    monkeypatch.delenv(var, raising=False)
  with pytest.raises(ConfigError, match="coordinator: expected 'auto' inside a cluster jax "
                                        "detects .*, got 'auto' with none detected"):
    parallel.distributed.initialize('auto')


HEARTBEAT_S = 5   # PURAX_HEARTBEAT_TIMEOUT of the host-death tests (default 30)
# The README's bound (the heartbeat timeout plus a watchdog period) holds by
# construction: the watchdog decides after HEARTBEAT_S of silence, and jax's
# own abort is set to 2 * HEARTBEAT_S + 10 s, so an exit 75 with the purax
# message is the watchdog's. The tests assert that decision, not a wall time
# (measured: 4.9-5.3 s from the kill to the exit; the closing note of session 14).
LOST = 'purax: process 0: lost process 1 (no sign of life for'
LOST_COORDINATOR = ('purax: process 1: lost process 0 (the coordination service) (no sign of '
                    'life for')
C_ABORT = ('Check failure', 'terminate called', 'SIGABRT', 'Fatal Python error')


@pytest.mark.parametrize('killed', [1, 0])
def test_a_killed_process_ends_the_survivor_with_status_75_naming_it(tmp_path, killed):
  """Issue 28.4: SIGKILL one process of a two-process `purax train`; the
  other exits 75 within the bound with a purax message naming the lost one
  (no C++ abort), and the newest committed checkpoint restores. Killing
  process 0 also takes the coordination service (it runs there): process 1's
  watchdog finds the service silent and names it."""
  from purax.io.checkpoint import Checkpointer
  from tests.helpers_runs import final_tree
  workdir = tmp_path / 'run'
  port = _free_port()
  env = _child_env(XLA_FLAGS=TWO_DEVICES, PURAX_HEARTBEAT_TIMEOUT=str(HEARTBEAT_S))
  cmd = [sys.executable, '-c', 'import sys; from purax.app.cli import main; sys.exit(main())',
         'train', '--model', 'mlp', '--dataset', 'digits', '--steps', '100000', '--mesh',
         'data=4', '--checkpoint-every', '10', '--eval-every', '0', '--log-every', '5',
         '--no-progress', '--workdir', str(workdir), '--coordinator', f'localhost:{port}',
         '--num-processes', '2']
  procs = [subprocess.Popen(cmd + ['--process-id', str(i)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT) for i in range(2)]
  try:
    deadline = time.monotonic() + TIMEOUT_S
    checkpoints = workdir / 'checkpoints'
    # A committed step is a directory named by its number (orbax renames it
    # from STEP.orbax-checkpoint-tmp); only read the names: a Checkpointer
    # opened here while the run writes would tidy its temporary directory away.
    while not (checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())):
      assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
          [p.poll() for p in procs]
      time.sleep(0.2)
    procs[killed].kill()
    procs[1 - killed].wait(timeout=TIMEOUT_S)
  finally:
    results = _finish(procs)
  assert results[killed][0] == -signal.SIGKILL
  code, log = results[1 - killed]
  assert code == parallel.distributed.PEER_LOST_STATUS == 75, (code, log[-3000:])
  assert (LOST if killed else LOST_COORDINATOR) in log, log[-3000:]
  assert 'exiting with status 75' in log, log[-3000:]
  # jax's client logs a fatal line and a C++ stack the moment the coordination
  # service's connection closes (process 0 killed), before any purax code can
  # run (docs/guides/reliability.md); the abort it leads to waits for the
  # watchdog's verdict, so no core dump and no terminate text either way.
  aborts = C_ABORT if killed else tuple(s for s in C_ABORT if s != 'Check failure')
  assert not any(s in log for s in aborts), log[-3000:]
  silent = float(re.search(r'no sign of life for (\d+) s', log).group(1))
  assert silent >= HEARTBEAT_S, log[-3000:]     # it waited the timeout, not less
  committed = Checkpointer(str(workdir / 'checkpoints')).steps()
  _, _, step = final_tree(str(workdir))
  assert committed and step == committed[-1] and step % 10 == 0, (committed, step)


ABORT_AFTER_LOSS = r'''
import ctypes, os, signal, sys, threading, time
from purax import parallel
me, port = int(sys.argv[1]), sys.argv[2]
parallel.distributed.initialize(f'localhost:{port}', 2, me, heartbeat_timeout_s=2)
parallel.distributed.agree('up', 'yes')
if me == 1:
  os.kill(os.getpid(), signal.SIGKILL)
time.sleep(0.5)
# What gloo does when the peer's connection breaks mid-collective: a C++
# thread throws (std::terminate, whose default handler prints 'terminate
# called after throwing ...' and calls abort()), or aborts (LOG(FATAL)),
# without the GIL.
end = (ctypes.CDLL('libstdc++.so.6')._ZSt9terminatev if sys.argv[3] == 'terminate'
       else ctypes.CDLL(None).abort)
threading.Thread(target=end).start()
time.sleep(60)
print('not ended')
'''


@pytest.mark.parametrize('end', ['terminate', 'abort'])
def test_a_cpp_abort_after_a_lost_peer_exits_75_naming_it(end):
  """The other paths to a C++ abort right after the peer dies (gloo's
  std::terminate on a broken connection, seen under load as 'terminate called
  after throwing gloo::EnforceNotMet'; a LOG(FATAL)): they wait for the
  watchdog's verdict and the process exits 75 with the purax message alone,
  no C++ text, no core dump."""
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, '-c', ABORT_AFTER_LOSS, str(i), str(port), end],
                            env=_child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT) for i in range(2)]
  (code, log), (code1, _) = _finish(procs)
  assert code1 == -signal.SIGKILL
  assert code == 75 and LOST in log, (code, log[-3000:])
  assert not any(s in log for s in C_ABORT) and 'not ended' not in log, log[-3000:]
