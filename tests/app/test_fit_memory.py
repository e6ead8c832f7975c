"""`purax train --fit-memory`: the choice printed, written into config.json,
kept by a resume in a fresh process; in --dry-run too; an out-of-memory step
names the flags that would fit."""

import json

import jax
import pytest

from purax.app import cli, job as job_lib, runs
from purax.app.config import TrainConfig
from purax.app.rundir import read_config
from purax.plan import memory
from purax.plan.candidates import Candidate
from tests.helpers_runs import purax

# The MLP on digits at a large batch: its activations are what microbatches cut.
ARGS = ['--model', 'mlp', '--batch-size', '1024', '--steps', '2', '--eval-every', '0',
        '--log-every', '1', '--no-progress', '--fit-memory']


@pytest.fixture(scope='module')
def budget():
  """A budget between the compiled peaks of one and two microbatches (the
  same programs the runs below compile: the suite's cache serves them)."""
  config = TrainConfig.of(model='mlp', batch_size=1024).validate()
  data = config.data.load()
  task = job_lib.build_task(config, num_classes=data.num_classes, input_shape=data.input_shape)
  sample = data.sample(1024)
  one, two = (memory.measure(Candidate(None, k).task(task), sample)['peak_bytes']
              for k in (1, 2))
  assert two < one
  return str(int(one + two) // 2)


def test_fit_memory_chooses_records_and_a_resume_in_a_fresh_process_keeps_it(
    tmp_path, capsys, budget):
  workdir = tmp_path / 'run'
  assert cli.main(['train', *ARGS, '--dry-run', '--memory-budget', budget,
                   '--workdir', str(workdir)]) == 0
  out = capsys.readouterr().out
  dry = json.loads(out.strip().splitlines()[-1])['dry_run']
  assert 'chose: microbatches=2' in out and not workdir.exists()
  assert dry['fit_memory']['flags'] == '--microbatches 2' and dry['peak_bytes'] <= int(budget)
  assert dry['fit_memory']['compiled'] == 2      # 4 and 8 do more work for memory not needed

  assert cli.main(['train', *ARGS, '--memory-budget', budget, '--workdir', str(workdir)]) == 0
  assert 'chose: microbatches=2' in capsys.readouterr().err
  saved = read_config(str(workdir))
  assert saved.optimizer.microbatches == 2 and saved.run.fit_memory

  resumed = purax('train', '--workdir', str(workdir), '--steps', '3')
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert 'resuming' in resumed.stderr and 'fit_memory: budget' not in resumed.stderr
  assert read_config(str(workdir)).optimizer.microbatches == 2
  assert json.loads((workdir / 'final_metrics.json').read_text())['step'] == 3


def test_a_run_out_of_memory_names_the_flags_that_fit(tmp_path, capsys, monkeypatch):
  """XLA's RESOURCE_EXHAUSTED during the run (raised here by a real allocation
  that cannot succeed) ends it with status 2 and a message naming the options
  that would fit: the budget is below the failed step's compiled peak."""
  def out_of_memory(*args, **kwargs):
    jax.jit(lambda: jax.numpy.zeros((2 ** 42,)) + 1)()
  monkeypatch.setattr(runs, 'fit', out_of_memory)
  args = [a for a in ARGS if a != '--fit-memory']
  assert cli.main(['train', *args, '--workdir', str(tmp_path / 'oom')]) == 2
  err = capsys.readouterr().err
  assert 'step: expected to fit the device memory, got RESOURCE_EXHAUSTED' in err
  assert 'of the step that failed), fastest first: --microbatches 2' in err
  assert not (tmp_path / 'oom').exists()


def test_fit_memory_options_are_checked(capsys):
  assert cli.main(['train', '--memory-budget', '2GiB']) == 2
  assert 'memory_budget: expected unset unless --fit-memory is set' in capsys.readouterr().err
  assert cli.main(['train', '--fit-memory', '--memory-budget', '2 parsecs']) == 2
  assert "memory_budget: expected a size such as '8GiB'" in capsys.readouterr().err
  assert cli.main(['train', '--fit-memory', '--fit-memory-precisions', 'fp32,fp99']) == 2
  assert 'precision' in capsys.readouterr().err
