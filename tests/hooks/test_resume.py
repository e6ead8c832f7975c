"""Hooks at log/eval points: early stopping's best score and patience counter
survive a restart in a fresh process."""

import functools

import pytest

from tests.helpers_runs import script

run = functools.partial(script, 'early_stopping_run.py')
run_population = functools.partial(script, 'population_resume.py')
run_ema = functools.partial(script, 'ema_run.py')


@pytest.mark.slow
def test_early_stopping_state_and_keep_best_survive_a_restart_in_a_fresh_process(tmp_path):
  """The early-stopping counter, and keep-best by a train metric (issue 29.7:
  any logged metric, a mode): saves at 2, 4, 6, 8 compete by train/loss
  (min); a run stopped at 6 and resumed in a fresh process keeps what the
  straight run keeps, its ranking continued from the recorded numbers."""
  straight = run(tmp_path / 'straight', 0)
  # evals at 2 (best), 4, 6, 8 (3 stale); the best save by train/loss is step 4.
  assert straight == 'final step 8 stale 3 kept [4, 8]'
  assert run(tmp_path / 'split', 6) == 'final step 6 stale 2 kept [4, 6]'
  # A fresh process: without the saved counter it would run on to step 12, and
  # without the recorded train/loss step 4 would not compete.
  assert run(tmp_path / 'split', 0) == straight




@pytest.mark.slow
def test_a_population_with_pbt_and_loss_scales_resumes_bitwise_in_a_fresh_process(tmp_path):
  """PBT's outcome (copied members, perturbed hyperparameters), the status
  arrays and the loss-scale counters are state: a run stopped at step 4 and
  resumed in a new process ends bitwise where the straight run ends."""
  import numpy as np
  assert run_population(tmp_path / 'a', 0, tmp_path / 'a.npz') == 'final step 8'
  assert run_population(tmp_path / 'b', 4, tmp_path / 'b4.npz') == 'final step 4'
  assert run_population(tmp_path / 'b', 0, tmp_path / 'b.npz') == 'final step 8'
  a, b = np.load(tmp_path / 'a.npz'), np.load(tmp_path / 'b.npz')
  assert sorted(a.files) == sorted(b.files)
  for name in a.files:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  hp = [n for n in a.files if 'learning_rate' in n]
  assert hp and not np.allclose(a[hp[0]], [1e-3, 3e-3, 1e-2, 3e-2])   # PBT changed them


# -- EMA: the average survives a restart --



@pytest.mark.slow
def test_ema_resumed_in_a_fresh_process_equals_the_uninterrupted_run(tmp_path):
  """Stopped at step 5 (samples at 2 and 4 taken), resumed in a new process to
  step 10: the average, its count and the params equal the straight run's,
  bitwise (CPU). Without the saved average the resumed run would restart it
  from the step-5 params."""
  import numpy as np
  assert run_ema(tmp_path / 'a', 0, tmp_path / 'a.npz') == 'final step 10 samples 5'
  assert run_ema(tmp_path / 'b', 5, tmp_path / 'b5.npz') == 'final step 5 samples 2'
  assert run_ema(tmp_path / 'b', 0, tmp_path / 'b.npz') == 'final step 10 samples 5'
  a, b = np.load(tmp_path / 'a.npz'), np.load(tmp_path / 'b.npz')
  assert sorted(a.files) == sorted(b.files) and any(n.startswith('ema') for n in a.files)
  for name in a.files:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  ema = [n for n in a.files if n.startswith('ema')]
  assert not all(np.array_equal(a[n], a['params' + n[3:]]) for n in ema)   # an average
