"""`purax tune lr`: the range test of a `purax train` job on the command line."""

import json
import logging
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


def test_tune_lr_on_the_small_lm_compiles_one_program_for_the_grid(tmp_path, capsys, caplog):
  """One program for the whole grid of 4 learning rates (the population's
  train step compiled once: counted in its jit cache, which other programs a
  process has compiled before do not move); the plot, the curve and the
  suggestion in the run directory, the suggestion printed as the flag to pass."""
  from purax.plan import members
  caplog.set_level(logging.INFO)     # the purax logger's lines go to the root's handlers
  workdir = tmp_path / 'lr'
  before = members.train_step._cache_size()
  assert cli.main(['tune', 'lr', *LM, '--dataset', corpus(tmp_path), '--steps', '8',
                   '--num-lrs', '4', '--min-lr', '1e-4', '--max-lr', '1.0',
                   '--strategy', 'vmap', '--workdir', str(workdir)]) == 0
  assert members.train_step._cache_size() - before == 1
  printed = capsys.readouterr()
  lines = printed.out.strip().splitlines()
  out = json.loads(lines[-1])['lr_range']
  progress = [line for line in caplog.messages if line.startswith('[range test ')]
  assert [line.split(']')[0] for line in progress] == [f'[range test {s}/8' for s in range(1, 9)]
  assert 'least loss' in progress[-1] and 'of 4 non-finite' in progress[-1]
  assert 'compiling the population' in printed.err
  assert sorted(os.listdir(workdir)) == ['.purax.lock', 'lr_range.json', 'lr_range.png',
                                         'tune_config.json']   # the checkpoints removed
  assert out['plot'] == str(workdir / 'lr_range.png') and out['rule'] == 'lowest'
  with open(workdir / 'lr_range.png', 'rb') as f:
    assert f.read(4) == b'\x89PNG'
  saved = json.loads((workdir / 'lr_range.json').read_text())
  lrs = np.asarray(saved['lrs'])
  np.testing.assert_allclose(lrs, np.geomspace(1e-4, 1.0, 4), rtol=1e-6)
  assert np.asarray(saved['losses'], dtype=float).shape == (8, 4)
  smoothed = np.asarray(saved['smoothed'], dtype=float)
  assert out['suggestion'] == saved['suggestion'] == tune.suggest(lrs, smoothed, 'lowest')
  assert out['flags'] == f"--learning-rate {out['suggestion']:.3g}"
  assert saved['config']['model'] == 'lm' and saved['config']['steps'] == 8


def test_num_lrs_beyond_its_bound_or_the_memory_is_refused_before_any_state(tmp_path, capsys,
                                                                            monkeypatch):
  """--num-lrs 1e9 is refused by the config at once (before its grid, 8 GB of
  float64, is made); a grid whose states do not fit the memory available
  (here 1 MiB) is refused after the job is traced, before any state exists."""
  from purax.app import job as job_lib
  from purax.app import tune as app_tune
  from purax.plan import budget
  from purax.tune import lr_range
  with monkeypatch.context() as patched:     # refused before the grid is made
    patched.setattr(lr_range, 'log_grid', lambda *a: pytest.fail('the grid was made'))
    assert cli.main(['tune', 'lr', '--num-lrs', str(10 ** 9),
                     '--workdir', str(tmp_path / 'a')]) == 2
  assert ('num_lrs: expected 2 to 2**16 = 65536 learning rates (each a member of the '
          'population, with a whole training state), got 1000000000') in capsys.readouterr().err
  monkeypatch.setattr(budget, 'available_bytes', lambda device=None: 2 ** 20)
  monkeypatch.setattr(budget, 'ALWAYS_FITS', 0)
  monkeypatch.setattr(job_lib.Job, 'init', lambda self, seed: pytest.fail('a state was made'))
  config = cli.parse(['tune', 'lr', '--model', 'mlp', '--num-lrs', '16', '--steps', '8',
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


def test_tune_lr_draws_a_bar_on_a_terminal_and_not_with_no_progress(tmp_path, capsys, caplog,
                                                                   monkeypatch):
  """On a terminal a tqdm bar with the least loss so far, no plain lines;
  --no-progress: the plain lines instead, as without a terminal."""
  from purax.io import progress
  caplog.set_level(logging.INFO)     # the purax logger's lines go to the root's handlers
  monkeypatch.setattr(progress, 'interactive', lambda stream=None: True)
  small = ['--model', 'mlp', '--dataset', 'digits', '--batch-size', '16', '--steps', '8',
           '--num-lrs', '3', '--min-lr', '1e-3', '--max-lr', '0.1', '--strategy', 'vmap']
  assert cli.main(['tune', 'lr', *small, '--workdir', str(tmp_path / 'a')]) == 0
  printed = capsys.readouterr()
  assert 'range test' in printed.err and '8/8' in printed.err and 'least loss' in printed.err
  assert not [m for m in caplog.messages if m.startswith('[range test ')]
  assert cli.main(['tune', 'lr', *small, '--no-progress', '--workdir', str(tmp_path / 'b')]) == 0
  printed = capsys.readouterr()
  assert '8/8' not in printed.err
  assert [m for m in caplog.messages if m.startswith('[range test 8/8] least loss')]


# -- --time-budget: the steps planned on a fake clock (counts, never wall times) ------------

BUDGETED = ['tune', 'lr', '--model', 'mlp', '--dataset', 'digits', '--batch-size', '16',
            '--num-lrs', '3', '--min-lr', '1e-3', '--max-lr', '0.1', '--strategy', 'vmap',
            '--no-progress', '--time-budget', '16s']


class FakeClock:
  """A clock set by the range test's step calls: ``start`` before the first,
  then ``start + compile_s`` plus the step times of the calls made (binary
  fractions: every sum is exact); ``compiled()``: ``compile_s`` once the first
  call has run."""

  def __init__(self, monkeypatch, *, start=96.0, started=96.0, compile_s=2.0,
               step_s=lambda call: 2 ** -4):
    from purax.app import job as job_lib
    from purax.app import tune as app_tune
    from purax.hooks import TimeBudget
    from purax.tune import lr_range
    self.start, self.compile_s, self.step_s, self.calls = start, compile_s, step_s, 0
    step = lr_range.RangeTest.step

    def counted(test, batch):
      step(test, batch)
      self.calls += 1
    monkeypatch.setattr(lr_range.RangeTest, 'step', counted)
    monkeypatch.setattr(app_tune.job_lib, 'time_budget', lambda duration, eval_data, **k:
                        TimeBudget(16.0, started=started, tail_s=1.0, clock=self.clock,
                                   compiled=self.compiled))
    assert app_tune.job_lib is job_lib

  def clock(self):
    if not self.calls:
      return self.start
    return self.start + self.compile_s + sum(self.step_s(c) for c in range(self.calls))

  def compiled(self):
    return self.compile_s if self.calls else 0.0


def test_tune_lr_plans_its_steps_to_the_budget_and_writes_a_verdict(tmp_path, monkeypatch):
  """Compilation 2 s (left out), 1/16 s a step, 1 s kept for the end: planned
  after the first call and 3 timed steps at 4 + floor((112 - 98.25 - 1) * 16) =
  208 steps, far below --steps; the verdict holds the suggestion and the curve."""
  from purax.app import verdict as verdict_lib
  FakeClock(monkeypatch)
  workdir = tmp_path / 'lr'
  assert cli.main([*BUDGETED, '--steps', '100000', '--workdir', str(workdir)]) == 0
  saved = json.loads((workdir / 'lr_range.json').read_text())
  assert np.asarray(saved['losses'], dtype=float).shape == (208, 3)
  assert saved['window'] == 208 // 4            # the last quarter of the steps trained
  verdict = verdict_lib.read(str(workdir))
  assert verdict['status'] == 'finished' and verdict['step'] == 208
  assert verdict['end']['reason'] == ('time budget of 16 s: 208 steps at 62.5 ms a step '
                                      '(compilation 2.0 s left out)')
  assert verdict['suggestion'] == saved['suggestion'] and verdict['rule'] == 'lowest'
  assert verdict['curve']['losses'] == saved['losses']
  assert verdict['seen_per_rate'] == {'examples': 208 * 16}
  assert verdict['config']['time_budget'] == '16s' and verdict['config']['steps'] == 100000
  budget = verdict['time_budget']
  assert (budget['compile_s'], budget['step_s'], budget['planned_step']) == (2.0, 2 ** -4, 208)
  assert budget['plans'][0] == {'step': 4, 'step_s': 2 ** -4, 'planned_step': 208}
  assert budget['replans'] == 10                 # every tenth of the plan: steps 24, 44, .. 204
  assert verdict['budget_s'] == 16.0 and verdict['memory_fits'] == []
  # --steps first: the budget plans 208, the test ends at 12 steps.
  FakeClock(monkeypatch)
  assert cli.main([*BUDGETED, '--steps', '12', '--workdir', str(tmp_path / 'short')]) == 0
  verdict = verdict_lib.read(str(tmp_path / 'short'))
  assert verdict['step'] == 12 and verdict['end']['reason'] == 'reached step 12'
  assert verdict['time_budget']['planned_step'] == 208


@pytest.mark.parametrize('compile_s, step_s, message, calls', [
    # 15 s of 16 compiling: 1/16 s a step, 7 more steps and 1 s do not fit.
    (15.0, lambda c: 2 ** -4, r'time_budget: expected at least 16\.5 s \(15\.\d s of '
     r'start-up and compilation, the compilation 15\.0 s of it; 7 more steps \(a range test '
     r'reads at least 8\); and 1\.0 s kept for the suggestion, its plot and files\), got 16 s',
     1),
    # The first call's step fits 8 steps; the probe's (1/4 s) leaves room for 4 only.
    (14.0, lambda c: 2 ** -4 if c == 0 else 2 ** -2, r'time_budget: expected a budget that '
     r'holds at least 8 steps of 250 ms .*, got 16 s, which holds 4 steps', 4),
])
def test_a_budget_too_short_for_a_range_test_is_a_named_error_leaving_no_directory(
    tmp_path, monkeypatch, compile_s, step_s, message, calls):
  from purax.app import tune as app_tune
  fake = FakeClock(monkeypatch, compile_s=compile_s, step_s=step_s)
  workdir = tmp_path / 'lr'
  with pytest.raises(tune.RangeTestError, match=message):
    app_tune.run(cli.parse([*BUDGETED, '--steps', '100', '--workdir', str(workdir)]).what)
  assert fake.calls == calls and not workdir.exists()


def test_a_bad_or_spent_budget_trains_nothing(tmp_path, monkeypatch, capsys):
  from purax.app import tune as app_tune
  assert cli.main(['tune', 'lr', '--time-budget', '60', '--workdir', str(tmp_path / 'a')]) == 2
  assert "time_budget: expected a duration such as '60s'" in capsys.readouterr().err
  fake = FakeClock(monkeypatch, started=76.0)      # 20 s of start-up, of 16
  workdir = tmp_path / 'lr'
  with pytest.raises(ConfigError, match=r'time_budget: expected more than the 20\.0 s the '
                                        r'start-up took'):
    app_tune.run(cli.parse([*BUDGETED, '--workdir', str(workdir)]).what)
  assert fake.calls == 0 and not workdir.exists()
