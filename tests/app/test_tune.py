"""`purax tune lr`: the range test of a `purax train` job on the command line."""

import json
import os

import numpy as np
import pytest

from purax import tune
from purax.core.errors import ConfigError
from purax.app import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LM = ['--model', 'lm', '--d-model', '16', '--num-layers', '1', '--num-heads', '2',
      '--seq-len', '16', '--batch-size', '8', '--warmup-steps', '0']


def corpus(tmp_path):
  path = tmp_path / 'corpus.txt'
  with open(os.path.join(ROOT, 'purax', 'core', 'errors.py'), encoding='utf-8') as f:
    path.write_text(f.read())
  return f'text:{path}'


def test_tune_lr_on_the_small_lm_compiles_one_program_for_the_grid(tmp_path, capsys):
  """One program for the whole grid of 4 learning rates (the population's
  train step compiled once: counted in its jit cache, which other programs a
  process has compiled before do not move); the plot, the curve and the
  suggestion in the run directory, the suggestion printed as the flag to pass."""
  from purax.core import population
  workdir = tmp_path / 'lr'
  before = population.train_step._cache_size()
  assert cli.main(['tune', 'lr', *LM, '--dataset', corpus(tmp_path), '--steps', '6',
                   '--num-lrs', '4', '--min-lr', '1e-4', '--max-lr', '1.0',
                   '--strategy', 'vmap', '--workdir', str(workdir)]) == 0
  assert population.train_step._cache_size() - before == 1
  out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])['lr_range']
  assert sorted(os.listdir(workdir)) == ['.purax.lock', 'lr_range.json', 'lr_range.png',
                                         'tune_config.json']   # the checkpoints removed
  assert out['plot'] == str(workdir / 'lr_range.png') and out['rule'] == 'steepest'
  with open(workdir / 'lr_range.png', 'rb') as f:
    assert f.read(4) == b'\x89PNG'
  saved = json.loads((workdir / 'lr_range.json').read_text())
  lrs = np.asarray(saved['lrs'])
  np.testing.assert_allclose(lrs, np.geomspace(1e-4, 1.0, 4), rtol=1e-6)
  assert np.asarray(saved['losses'], dtype=float).shape == (6, 4)
  smoothed = np.asarray(saved['smoothed'], dtype=float)
  assert out['suggestion'] == saved['suggestion'] == tune.suggest(lrs, smoothed, 'steepest')
  assert out['flags'] == f"--learning-rate {out['suggestion']:.3g}"
  assert saved['config']['model'] == 'lm' and saved['config']['steps'] == 6


def test_tune_lr_refuses_a_foreign_directory_and_bad_grids_before_any_work(tmp_path, capsys):
  (tmp_path / 'taken').mkdir()
  (tmp_path / 'taken' / 'notes.txt').write_text('mine')
  assert cli.main(['tune', 'lr', '--workdir', str(tmp_path / 'taken')]) == 2
  assert ('workdir: expected a new or empty directory, or a purax range test directory to '
          "resume (with tune_config.json), got") in capsys.readouterr().err
  assert os.listdir(tmp_path / 'taken') == ['notes.txt']
  assert cli.main(['tune', 'lr', '--min-lr', '1e-2', '--max-lr', '1e-3']) == 2
  assert 'min_lr, max_lr: expected 0 < min_lr < max_lr' in capsys.readouterr().err
  assert cli.main(['tune', 'lr', '--max-lr', '20']) == 2
  assert 'max_lr: expected <= 10' in capsys.readouterr().err
  assert os.listdir(tmp_path) == ['taken']


def test_num_lrs_beyond_its_bound_or_the_memory_is_refused_before_any_state(tmp_path, capsys,
                                                                            monkeypatch):
  """--num-lrs 1e9 is refused by the config at once (before its grid, 8 GB of
  float64, is made); a grid whose states do not fit the memory available
  (here 1 MiB) is refused after the job is traced, before any state exists."""
  import time
  from purax.app import job as job_lib
  from purax.app import tune as app_tune
  from purax.plan import budget
  start = time.perf_counter()
  assert cli.main(['tune', 'lr', '--num-lrs', str(10 ** 9), '--workdir', str(tmp_path / 'a')]) == 2
  assert time.perf_counter() - start < 5
  assert ('num_lrs: expected 2 to 2**16 = 65536 learning rates (each a member of the '
          'population, with a whole training state), got 1000000000') in capsys.readouterr().err
  monkeypatch.setattr(budget, 'available_bytes', lambda device=None: 2 ** 20)
  monkeypatch.setattr(budget, 'ALWAYS_FITS', 0)
  monkeypatch.setattr(job_lib.Job, 'init', lambda self, seed: pytest.fail('a state was made'))
  config = cli.parse(['tune', 'lr', '--model', 'mlp', '--num-lrs', '16', '--steps', '2',
                      '--workdir', str(tmp_path / 'b')]).what
  with pytest.raises(ConfigError, match=r'^num_lrs: expected a population of 16 members that '
                     r'fits in the 1.00 MiB available .*, got 16, needing [\d.]+ MiB'):
    app_tune.run(config)
  assert os.listdir(tmp_path) == []
  assert cli.main(['tune', 'lr', '--checkpoint-every', '-1']) == 2
  assert 'checkpoint_every: expected >= 0' in capsys.readouterr().err


RESUMED = ['--model', 'mlp', '--dataset', 'digits', '--batch-size', '16', '--steps', '8',
           '--num-lrs', '3', '--checkpoint-every', '2']


@pytest.mark.slow
def test_tune_lr_stopped_by_sigint_resumes_with_the_same_command_bitwise(tmp_path):
  """SIGINT before the 5th step: exit 0 after a checkpoint at step 5; the same
  command resumes it to the lr_range.json of a straight run, bitwise."""
  from tests.helpers_signals import signal_at
  from tests.helpers_runs import purax
  straight, resumed = tmp_path / 'straight', tmp_path / 'resumed'
  done = purax('tune', 'lr', *RESUMED, '--workdir', straight)
  assert done.returncode == 0, done.stderr[-3000:]
  stopped = signal_at('step:5', 'SIGINT', 'tune', 'lr', *RESUMED, '--workdir', resumed)
  assert stopped.returncode == 130, stopped.stderr[-3000:]
  assert json.loads(stopped.stdout.strip().splitlines()[-1]) == {
      'lr_range': {'stopped_by': 'SIGINT', 'step': 5}}
  assert sorted(os.listdir(resumed / 'checkpoints')) == ['4', '5']
  done = purax('tune', 'lr', *RESUMED, '--workdir', resumed)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f'resuming range test {resumed} from step 5' in done.stderr
  want, got = (json.loads((d / 'lr_range.json').read_text()) for d in (straight, resumed))
  assert want.pop('plot') != got.pop('plot')
  assert got == want      # every member's loss at every step, the curve, the suggestion
