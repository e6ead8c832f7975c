"""Resume and failure, end to end in fresh processes (bitwise on CPU)."""

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from purax.app import cli, runs
from purax.app import job as job_lib
from purax.app.config import TrainConfig
from purax.app.rundir import read_config
from purax.io.checkpoint import Checkpointer
from purax.testing import Tolerance, assert_trees_close
from tests.helpers import assert_bitwise
from tests.helpers_runs import ARGS, ENV, ROOT, batches, final_tree, logged, purax


def test_half_save_new_process_half_equals_straight_bitwise(tmp_path, straight_run):
  straight, split = straight_run, str(tmp_path / 'split')
  first = purax('train', *ARGS, '--workdir', split, recorded_stop=20)
  assert first.returncode == 0, first.stderr
  assert Checkpointer(os.path.join(split, 'checkpoints')).steps()[-1] == 20
  second = purax('train', '--workdir', split, recorded_stop=0)   # bare: the saved config
  assert second.returncode == 0, second.stderr
  assert 'resuming' in second.stderr and 'from step 20' in second.stderr
  a, extra_a, step_a = final_tree(straight)
  b, extra_b, step_b = final_tree(split)
  assert step_a == step_b == 40 and extra_a['data'] == extra_b['data'] == {
      'next_step': 40, 'batch_size': 32}
  assert_bitwise(a, b)     # params, opt_state, rng, model_state, metrics window
  assert logged(straight) == logged(split)
  # precision 'auto' (the default) is recorded as what it resolved to here.
  with open(os.path.join(split, 'config.json')) as f:
    assert json.load(f)['model']['precision'] == 'fp32'
  assert batches(straight) == batches(split) and sorted(batches(split)) == list(range(40))


def last_logged_step(workdir):
  try:
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      lines = [l for l in f if l.strip()]
    return json.loads(lines[-1])['step'] if lines else 0
  except (OSError, ValueError, KeyError):
    return 0


def test_sigkill_at_random_points_then_resume_ends_with_the_uninterrupted_params(tmp_path):
  """Killed once during start-up (before any checkpoint) and at two random
  training steps (between and during asynchronous saves), resumed each time:
  the final state is bitwise the straight run's and metrics.jsonl holds every
  record of it (benchmarks/sigkill.py does this with 20 kills)."""
  args = ['--model', 'cnn', '--steps', '240', '--batch-size', '32', '--log-every', '10',
          '--eval-every', '0', '--checkpoint-every', '25', '--no-progress']
  reference = str(tmp_path / 'reference')
  assert purax('train', *args, '--workdir', reference).returncode == 0
  workdir = str(tmp_path / 'killed')
  rng = random.Random(0)
  plan = [('after_seconds', rng.uniform(1.0, 2.5))] + [
      ('at_step', s) for s in sorted(rng.sample(range(40, 220, 10), 2))]
  killed_at = []
  for kind, when in plan:
    cmd = [sys.executable, '-m', 'purax', 'train', *args, '--workdir', workdir]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
      deadline = time.time() + 120
      start = time.time()
      while proc.poll() is None and time.time() < deadline:
        if kind == 'after_seconds' and time.time() - start >= when:
          break
        if kind == 'at_step' and last_logged_step(workdir) >= when:
          break
        time.sleep(0.02)
    finally:
      if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        killed_at.append(last_logged_step(workdir))
      proc.wait()
  assert len(killed_at) == len(plan), f'a run ended before it was killed: {killed_at}'
  assert killed_at[-1] > 0
  done = purax('train', '--workdir', workdir)
  assert done.returncode == 0, done.stderr
  a, _, step_a = final_tree(reference)
  b, _, step_b = final_tree(workdir)
  assert step_a == step_b == 240
  assert_bitwise(a['state'], b['state'])
  # Issue 13.2: no record of metrics.jsonl lost or doubled by the kills.
  assert logged(workdir) == logged(reference)


def test_sigterm_commits_a_checkpoint_at_the_step_reached_and_exits_143(tmp_path):
  workdir = str(tmp_path / 'run')
  cmd = [sys.executable, '-m', 'purax', 'train', '--model', 'mlp', '--steps', '100000',
         '--checkpoint-every', '0', '--eval-every', '0', '--log-every', '10', '--no-progress',
         '--workdir', workdir]
  proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 120
    jsonl = os.path.join(workdir, 'metrics.jsonl')
    while not (os.path.exists(jsonl) and os.path.getsize(jsonl) > 0):
      assert time.time() < deadline and proc.poll() is None, 'training did not start'
      time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 143, err
  assert 'stopped by SIGTERM at step' in err and '(exit status 143)' in err
  reached = int(err.split('stopped by SIGTERM at step ')[1].split(';')[0])
  assert 10 <= reached < 100000
  assert Checkpointer(os.path.join(workdir, 'checkpoints')).steps() == [reached]
  assert json.loads(out.strip().splitlines()[-1])['final'] == {'stopped_by': 'SIGTERM',
                                                               'step': reached}


def test_resuming_with_a_changed_model_config_names_the_difference(tmp_path):
  workdir = str(tmp_path / 'run')
  config = TrainConfig.of(model='mlp', steps=5, batch_size=16, eval_every=0, workdir=workdir,
                       progress=False)
  runs.train(config)
  for change, message in [
      (dict(model='cnn'), "model: expected 'mlp' (as in the run being resumed"),
      (dict(dropout_rate=0.5), 'dropout_rate: expected 0.0 (as in the run being resumed'),
      (dict(learning_rate=1.0), 'learning_rate: expected 0.002'),
      # 'auto' was recorded as what it resolved to (fp32 on the CPU)
      (dict(precision='bf16'), "precision: expected 'fp32' (as in the run being resumed"),
  ]:
    with pytest.raises(Exception, match=message.replace('(', r'\(')):
      runs.train(TrainConfig.of(**{**config.flat(), **change}))
  # Cadence fields may change; the finished run is evaluated again, unchanged.
  with open(os.path.join(workdir, 'final_metrics.json')) as f:
    before = json.load(f)
  again = runs.train(TrainConfig.of(**{**config.flat(), 'log_every': 7}))
  assert again['accuracy'] == before['accuracy'] and again['examples'] == 360


def test_restore_onto_another_device_count_continues_the_run(tmp_path):
  """Saved by purax.fit on 8 devices (data parallel), restored by
  purax.restore_or_init(plan=) onto a mesh of 4 and of 1 in fresh processes
  that see only those, trained on by purax.fit: allclose, since the gradient
  all-reduce sums in another order (float32, rtol 1e-5)."""
  workdir = str(tmp_path)

  def script(*args):
    done = subprocess.run([sys.executable, '-m', 'tests.scripts.dp_resume', *args], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]

  script('8', 'straight', workdir)         # also checkpoints after 3 of its 6 steps
  script('4', 'second', workdir)
  script('1', 'second', workdir)
  straight = np.load(os.path.join(workdir, 'params.npz'))
  for devices in (4, 1):
    resumed = np.load(os.path.join(workdir, f'params-{devices}.npz'))
    assert set(resumed.files) == set(straight.files)
    for name in straight.files:
      np.testing.assert_allclose(resumed[name], straight[name], rtol=1e-5, atol=1e-6,
                                 err_msg=f'{devices} devices: {name}')


def test_cli_resumes_a_run_of_8_devices_on_4_and_on_one_with_the_same_global_batch(tmp_path,
                                                                                   capsys):
  """`purax train --workdir DIR --mesh data=4` (a process with 4 devices) and
  `--mesh None` (one device) on a run written with --mesh data=8: each
  continues at step 4 reading exactly batches 4..7 (the position counts global
  batches of --batch-size), records its mesh, and ends with the params of the
  uninterrupted data=8 run to float rounding (rtol 1e-5: the gradient
  all-reduce sums the per-device parts in another order on 8, 4 and 1
  devices; not bitwise). A changed global batch is refused by name."""
  args = ['--model', 'mlp', '--steps', '8', '--batch-size', '16', '--log-every', '2',
          '--eval-every', '0', '--checkpoint-every', '2', '--keep-last', '4', '--no-progress']
  straight = str(tmp_path / 'straight')
  assert cli.main(['train', *args, '--mesh', 'data=8', '--workdir', straight]) == 0
  resumed = {}
  for name in ('four', 'one'):     # the run as a preemption after step 4 left it
    resumed[name] = str(tmp_path / name)
    shutil.copytree(straight, resumed[name])
    for step in ('6', '8'):
      shutil.rmtree(os.path.join(resumed[name], 'checkpoints', step))
    os.remove(os.path.join(resumed[name], 'final_metrics.json'))
  four = subprocess.run(
      [sys.executable, '-m', 'tests.scripts.train_recorded', '0', 'train', '--workdir',
       resumed['four'], '--mesh', 'data=4'], cwd=ROOT, capture_output=True, text=True,
      env=dict(ENV, XLA_FLAGS=ENV['XLA_FLAGS'] + ' --xla_force_host_platform_device_count=4'),
      timeout=300)
  assert four.returncode == 0 and 'from step 4' in four.stderr, four.stderr[-3000:]
  assert cli.main(['train', '--workdir', resumed['one'], '--mesh', 'None']) == 0
  data = job_lib.build(read_config(straight).validate(), mesh=False).train_data
  assert batches(resumed['four']) == {
      s: hashlib.sha1(data[s]['x'].tobytes() + data[s]['y'].tobytes()).hexdigest()
      for s in range(4, 8)}
  want, want_extra, _ = final_tree(straight)
  for name, mesh in (('four', 'data=4'), ('one', None)):
    got, extra, step = final_tree(resumed[name])
    assert step == 8 and extra['data'] == want_extra['data'] == {'next_step': 8,
                                                                 'batch_size': 16}
    assert extra['mesh'] == read_config(resumed[name]).run.mesh == mesh
    assert_trees_close(got['state'].params, want['state'].params,
                       Tolerance(rtol=1e-5, atol=1e-7), what=f'params resumed on {name}')
  capsys.readouterr()
  assert cli.main(['train', '--workdir', resumed['one'], '--steps', '12',
                   '--batch-size', '8']) == 2
  assert 'batch_size: expected 16 (as in the run being resumed' in capsys.readouterr().err
