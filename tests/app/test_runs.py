"""A run's life from the command line (purax/app/runs.py): how it ends and says
so, what its resume does then, which checkpoints keep-best keeps, and readers
(eval, export) beside a writer. Every run is a fresh process."""

import json
import os
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest

from tests.helpers_runs import ENV, ROOT, ends, final_tree, logged, purax

MLP = ['--model', 'mlp', '--batch-size', '32', '--no-progress']


def best_step(workdir, metric, mode):
  """The step whose logged ``metric`` was best (ties: the older), from metrics.jsonl."""
  values = [(r[metric] if mode == 'min' else -r[metric], r['step'])
            for r in logged(workdir) if metric in r]
  return min(values)[1]


def committed(workdir):
  return sorted(int(e) for e in os.listdir(os.path.join(workdir, 'checkpoints')) if e.isdigit())


def test_an_early_stopped_run_says_so_exits_0_and_its_resume_trains_nothing(tmp_path):
  """--patience 2 by eval/loss, ranked as if higher were better: the first
  evaluation stays the best, so two more end the run at the third, early_stopped
  (it was reported as a signal, wrote no final_metrics.json, and the same command
  trained one more period each time). The same command in a fresh process says
  the run has ended and trains nothing."""
  workdir = str(tmp_path / 'run')
  args = ['train', *MLP, '--steps', '200', '--log-every', '10', '--eval-every', '10',
          '--best-metric', 'eval/loss', '--best-mode', 'max', '--patience', '2',
          '--workdir', workdir]
  done = purax(*args)
  assert done.returncode == 0, done.stderr[-3000:]
  evals = [r['step'] for r in logged(workdir) if 'eval/loss' in r]
  # The rule by hand: stale counts the evaluations not above the best so far.
  best, stale, stop = -np.inf, 0, None
  for r in logged(workdir):
    if 'eval/loss' in r and stop is None:
      best, stale = (r['eval/loss'], 0) if r['eval/loss'] > best else (best, stale + 1)
      stop = r['step'] if stale >= 2 else None
  assert stop is not None and evals[-1] == stop < 200
  assert f'early_stopped at step {stop}: eval/loss did not improve' in done.stderr
  assert 'signal' not in done.stderr
  final = json.load(open(os.path.join(workdir, 'final_metrics.json')))
  assert final['status'] == 'early_stopped' and final['step'] == stop
  assert final['end']['metric'] == 'eval/loss' and final['end']['best_step'] == evals[0]
  assert json.loads(done.stdout.splitlines()[-1])['final']['loss'] == final['loss']
  (end,) = ends(workdir)
  assert (end['step'], end['status']) == (stop, 'early_stopped')
  assert committed(workdir)[-1] == stop
  before = open(os.path.join(workdir, 'metrics.jsonl')).read()

  config = open(os.path.join(workdir, 'config.json')).read()
  with open(os.path.join(workdir, 'final_metrics.json'), 'w') as f:
    f.write('{"ste')                    # torn: written anew from the checkpoint, said
  again = purax(*args)                  # the same command, a fresh process
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'has already ended: nothing to train' in again.stderr
  assert f'early_stopped at step {stop}' in again.stderr
  assert 'final_metrics.json was missing or unreadable: written anew' in again.stderr
  assert committed(workdir)[-1] == stop
  assert open(os.path.join(workdir, 'metrics.jsonl')).read() == before
  assert open(os.path.join(workdir, 'config.json')).read() == config      # nothing ran
  assert json.loads(again.stdout.splitlines()[-1])['final']['loss'] == final['loss']
  assert json.load(open(os.path.join(workdir, 'final_metrics.json'))) == final

  patient = [a if a != '2' else '4' for a in args]   # --patience 4: two more evaluations
  more = purax(*patient)
  assert more.returncode == 0, more.stderr[-3000:]
  assert f'early_stopped at step {stop + 20}' in more.stderr
  assert json.load(open(os.path.join(workdir, 'config.json')))['run']['patience'] == 4


KEEP_BEST = [*MLP, '--steps', '200', '--log-every', '50', '--eval-every', '50',
             '--keep-best', '1', '--keep-last', '1', '--best-metric', 'eval/accuracy',
             '--best-mode', 'min', '--checkpoint-interval-s', '0']


@pytest.mark.parametrize('killed_at', [0, 120])
def test_keep_best_keeps_the_best_evaluation_also_across_a_restart(tmp_path, killed_at):
  """--keep-best 1 in a 200-step run evaluated every 50 steps, ranked by the
  lowest eval/accuracy (so the best is an early evaluation, not the last
  step): the kept checkpoints hold the step whose evaluation metrics.jsonl
  says was best, also when the run is stopped at step 120 and resumed in a
  fresh process; `purax eval --best` reads it and finds the logged numbers."""
  workdir = str(tmp_path / 'run')
  if killed_at:
    first = purax('train', *KEEP_BEST, '--workdir', workdir, recorded_stop=killed_at)
    assert first.returncode == 0 and committed(workdir)[-1] == killed_at, first.stderr[-2000:]
  done = purax('train', *KEEP_BEST, '--workdir', workdir)
  assert done.returncode == 0, done.stderr[-3000:]
  best = best_step(workdir, 'eval/accuracy', 'min')
  assert best < 200 and committed(workdir) == sorted({best, 200})
  assert f'best {best} (by eval/accuracy)' in done.stderr
  assert f'purax eval --workdir {workdir} --best' in done.stderr
  evaluated = purax('eval', '--workdir', workdir, '--best')
  assert evaluated.returncode == 0, evaluated.stderr[-2000:]
  logged_best = next(r for r in logged(workdir) if r['step'] == best and 'eval/loss' in r)
  printed = json.loads(evaluated.stdout.splitlines()[-1])
  assert (printed['step'], printed['checkpoint']) == (best, 'best')   # it says which
  got = printed['eval']
  assert got['accuracy'] == logged_best['eval/accuracy']
  assert got['loss'] == pytest.approx(logged_best['eval/loss'], rel=1e-6)


def test_a_misspelt_best_metric_is_named_before_anything_compiles(tmp_path):
  workdir = str(tmp_path / 'run')
  done = purax('train', *MLP, '--steps', '20', '--keep-best', '1', '--best-metric',
               'eval/acuracy', '--workdir', workdir)
  assert done.returncode == 2
  assert ("best_metric: expected a metric this run logs (did you mean eval/accuracy" in
          done.stderr), done.stderr[-2000:]
  assert "got 'eval/acuracy'" in done.stderr
  assert not os.path.exists(workdir)                # nothing written
  done = purax('train', *MLP, '--steps', '20', '--patience', '2', '--best-metric',
               'train/grad', '--workdir', workdir)
  assert done.returncode == 2 and 'did you mean train/grad_norm' in done.stderr


def snapshot(path):
  """Every entry under ``path`` with its size and modification time."""
  out = {}
  for root, dirs, files in os.walk(path):
    for name in dirs + files:
      full = os.path.join(root, name)
      st = os.lstat(full)
      out[os.path.relpath(full, path)] = (st.st_size, st.st_mtime_ns)
  return out


def test_readers_leave_the_run_directory_as_they_found_it(tmp_path):
  """eval and export open a run read-only: a writer's unfinished save
  (N.orbax-checkpoint-tmp-*) is its own to clean up, and nothing in the run
  directory is created, renamed or changed by a reader."""
  workdir = str(tmp_path / 'run')
  assert purax('train', *MLP, '--steps', '10', '--workdir', workdir).returncode == 0
  unfinished = os.path.join(workdir, 'checkpoints', '15.orbax-checkpoint-tmp-1234')
  os.makedirs(os.path.join(unfinished, 'state'))
  before = snapshot(workdir)
  out = str(tmp_path / 'exported')
  for args in (['eval', '--workdir', workdir], ['export', '--workdir', workdir, '--out', out]):
    done = purax(*args)
    assert done.returncode == 0, done.stderr[-2000:]
  assert snapshot(workdir) == before


READER_ARGS = [*MLP, '--steps', '400', '--log-every', '50', '--eval-every', '200',
               '--checkpoint-every', '5', '--keep-last', '2']


def test_a_loop_of_readers_beside_a_training_run_leaves_it_running_and_bitwise_equal(tmp_path):
  """purax eval and purax export in a loop while purax train saves every 5
  steps (an unfinished save is on disk most of the time): the trainer runs to
  the end (it died 10 times in 34 evaluations when a reader cleaned up its
  unfinished saves) and ends bitwise equal to an undisturbed run."""
  disturbed, straight = str(tmp_path / 'disturbed'), str(tmp_path / 'straight')
  trainer = subprocess.Popen([sys.executable, '-m', 'purax', 'train', *READER_ARGS,
                              '--workdir', disturbed], cwd=ROOT, env=ENV, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  results = []

  def read(kind):
    n = 0
    while trainer.poll() is None:
      if not os.path.isdir(os.path.join(disturbed, 'checkpoints')) or not committed(disturbed):
        continue
      args = (['eval', '--workdir', disturbed] if kind == 'eval' else
              ['export', '--workdir', disturbed, '--out', str(tmp_path / f'export{n}')])
      done = purax(*args)
      results.append((kind, done.returncode, done.stderr[-500:]))
      n += 1
  readers = [threading.Thread(target=read, args=(k,)) for k in ('eval', 'export')]
  for r in readers:
    r.start()
  out, err = trainer.communicate(timeout=600)
  for r in readers:
    r.join()
  assert trainer.returncode == 0, err[-3000:]
  assert results, 'no reader ran while the trainer did'
  # A reader may meet a checkpoint the trainer deletes as it reads (keep-last 2):
  # it fails with a named error, never the trainer.
  assert all(rc in (0, 2) for _, rc, _ in results), results
  assert any(rc == 0 for _, rc, _ in results), results
  assert purax('train', *READER_ARGS, '--workdir', straight).returncode == 0
  (a, _, step_a), (b, _, step_b) = final_tree(disturbed), final_tree(straight)
  assert step_a == step_b == 400
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_a_reader_reads_again_when_a_writer_deleted_its_checkpoint(tmp_path, monkeypatch):
  """A checkpoint a reader chose can be deleted by the trainer beside it
  (keep-last) while it reads: the reader reads the directory again (export
  exited 2 twice in 11 tries beside `train --checkpoint-every 5`); any other
  failure is raised at once."""
  from purax.app import runs
  from purax.io.checkpoint import CheckpointError
  workdir = str(tmp_path / 'run')
  assert purax('train', *MLP, '--steps', '4', '--workdir', workdir).returncode == 0
  real, calls = runs._restore_run, []

  def flaky(*args):
    calls.append(1)
    if len(calls) == 1:
      try:
        raise FileNotFoundError(2, 'No such file or directory', 'checkpoints/2680')
      except FileNotFoundError as e:
        raise CheckpointError('checkpoint directory: expected readable, got '
                              'FileNotFoundError') from e
    return real(*args)
  monkeypatch.setattr(runs, '_restore_run', flaky)
  _, state = runs.restore_run(workdir, need_data=False)
  assert len(calls) == 2 and int(state.step) == 4

  def broken(*args):
    calls.append(1)
    raise CheckpointError('checkpoint 4 is unreadable: SHA-256 mismatch')
  monkeypatch.setattr(runs, '_restore_run', broken)
  calls.clear()
  with pytest.raises(CheckpointError, match='SHA-256 mismatch'):
    runs.restore_run(workdir, need_data=False)
  assert len(calls) == 1
