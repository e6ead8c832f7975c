"""A run on a time budget whose step runs out of memory fits again on its own
(:func:`purax.app.runs.refit`, :func:`purax.app.fit_memory.refit_config`):
for real, on the CPU, with the address space limited from the start of
training (tests/scripts/memory_limited.py) and a model whose step needs much
memory for little work (tests/scripts/wide_net.py)."""

import dataclasses
import json
import math
import os

import jax
import pytest

from purax.app import fit_memory, job as job_lib, verdict as verdict_lib
from purax.app.config import TrainConfig
from purax.app.rundir import read_config
from purax.core.errors import OutOfMemoryError
from purax.plan import memory as plan_memory
from tests.helpers_runs import ENV, ROOT, purax

import subprocess
import sys

ARGS = ['--model', 'tests.scripts.wide_net:make', '--batch-size', '128',
        '--eval-batch-size', '32', '--warmup-steps', '5', '--steps', '200', '--log-every', '5',
        '--no-progress']
BUDGET_S = 40.0
#: The address space the training may grow by (MiB): the step of 1 microbatch
#: (a 2 GiB peak) cannot fit; of 2 (1 GiB, with the run's other needs, some
#: 350 MiB) can.
HEADROOM_MIB = 1700


def limited_train(workdir, *args):
  env = dict(ENV, MALLOC_ARENA_MAX='2', JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, '-m', 'tests.scripts.memory_limited', str(HEADROOM_MIB),
                         'train', *ARGS, '--workdir', str(workdir), *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)


def peaks() -> dict[int, int]:
  """Ground truth: the compiled peak of the step per microbatch count (bytes)."""
  config = TrainConfig.of(model='tests.scripts.wide_net:make', batch_size=128).validate()
  data = config.data.load()
  out = {}
  for m in (1, 2, 4, 8):
    c = dataclasses.replace(config, optimizer=dataclasses.replace(config.optimizer,
                                                                  microbatches=m))
    task = job_lib.build_task(c, num_classes=data.num_classes, input_shape=data.input_shape)
    out[m] = plan_memory.measure(task, data.sample(128))['peak_bytes']
  return out


@pytest.fixture(scope='module')
def refitted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('refit') / 'run'
  done = limited_train(workdir, '--time-budget', f'{BUDGET_S:g}s')
  assert done.returncode == 0, done.stderr[-3000:]
  return workdir, done


def test_a_step_out_of_memory_is_fitted_again_and_the_run_finishes_on_its_budget(refitted):
  workdir, done = refitted
  records = fit_memory.refits(str(workdir))
  assert records and all(r['action'] == 'memory_refit' for r in records)
  # The step as asked (one microbatch) ran out of memory for real, and so did
  # every choice but the last; each refit chose below the step that failed.
  assert records[0]['failed']['microbatches'] == 1
  assert all('out of memory' in r['error'].lower() for r in records)
  for before, after in zip(records, records[1:]):
    assert after['failed'] == {**before['chosen'], 'peak_bytes': after['failed']['peak_bytes']}
  truth = peaks()
  for r in records:
    failed, chosen = r['failed']['microbatches'], r['chosen']['microbatches']
    assert r['failed']['peak_bytes'] == truth[failed]
    assert r['budget_bytes'] == int(truth[failed] * (1 - plan_memory.MARGIN))
    # The fastest that fits: fewest microbatches (least work) whose peak is within.
    assert chosen == min(m for m in truth if truth[m] <= r['budget_bytes'])
    assert r['resumed_from_step'] == 0          # it failed at its first step: nothing kept
  last = records[-1]['chosen']['microbatches']
  assert last in (2, 4, 8)
  # config.json keeps the choice (a resumed run takes it); the verdict lists every refit.
  assert read_config(str(workdir)).optimizer.microbatches == last
  verdict = verdict_lib.read(str(workdir))
  assert verdict['status'] == 'finished' and verdict['memory_fits'] == records
  assert verdict['step'] > 0 and math.isfinite(verdict['metric']['eval/loss'])   # it trained
  assert f'fitted again below it (--microbatches 1 -> {records[0]["chosen"]["microbatches"]}' \
      in done.stderr


def test_a_resumed_refitted_run_keeps_the_choice_in_a_fresh_process(refitted):
  workdir, _ = refitted
  records = fit_memory.refits(str(workdir))
  reached = verdict_lib.read(str(workdir))['step']
  # The same command without its budget, 3 steps more: no memory limit now,
  # yet the run keeps its refitted microbatches (another count would be refused).
  done = purax('train', *ARGS[:ARGS.index('--steps')], '--steps', str(reached + 3),
               '--log-every', '1', '--no-progress', '--time-budget', 'None',
               '--workdir', str(workdir))
  assert done.returncode == 0, done.stderr[-3000:]
  assert f'resuming {workdir} from step {reached}' in done.stderr
  assert read_config(str(workdir)).optimizer.microbatches == records[-1]['chosen']['microbatches']
  assert fit_memory.refits(str(workdir)) == records        # nothing refitted again
  with open(workdir / 'final_metrics.json') as f:
    assert json.load(f)['step'] == reached + 3


def test_a_step_that_fits_nowhere_below_the_failure_is_a_named_error(tmp_path):
  config = TrainConfig.of(model='tests.scripts.wide_net:make', batch_size=128,
                          fit_memory=True, memory_budget='1MiB').validate()
  error = jax.errors.JaxRuntimeError('RESOURCE_EXHAUSTED: Out of memory allocating 7 bytes.')
  with pytest.raises(OutOfMemoryError, match=r'RESOURCE_EXHAUSTED: Out of memory allocating 7 '
                     r'bytes\.; fitting the step again below it \(given\): memory_budget: '
                     r'expected a configuration whose step fits 1\.00 MiB') as e:
    fit_memory.refit_config(config, error, stream=None)
  assert e.value.__cause__ is error


def test_without_a_budget_an_out_of_memory_step_is_not_refitted(tmp_path):
  done = limited_train(tmp_path / 'run', '--steps', '3')
  assert done.returncode != 0
  assert 'OutOfMemoryError' in done.stderr or 'configurations that fit' in done.stderr
  assert not os.path.exists(tmp_path / 'run' / fit_memory.REFITS)
