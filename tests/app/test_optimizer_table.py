"""The optimizer table of the CLI (purax.app.optimizer_table): --optimizer NAME from
its rows, each optimizer's hyperparameters sweepable where they are injected,
the rows it does not take refused by name, a schedule-free run evaluated,
averaged and exported at its evaluation params."""

import dataclasses
import json

import jax
import numpy as np
import pytest

import purax
from purax.app import cli, data, plot, runs, sweep
from purax.app import hparam_table as hparams
from purax.app import job as job_lib
from purax.core import population as pop_lib
from purax.app.config import TrainConfig
from purax.app.optimizer_table import OPTIMIZERS
from purax.app.sweep import SweepConfig
from purax.core.errors import ConfigError
from purax.io.checkpoint import Checkpointer

SAMPLE = data.sample_batch((8, 8, 1), np.float32, (), np.int32, 2)
SMALL = ['--model', 'mlp', '--steps', '6', '--batch-size', '16', '--log-every', '3',
         '--eval-every', '3', '--warmup-steps', '2', '--no-progress']


def test_the_choices_are_the_table_and_a_row_the_optimizer_does_not_take_is_refused(capsys):
  with pytest.raises(SystemExit):
    cli.main(['train', '--help'])
  assert '{' + ','.join(OPTIMIZERS) + '}' in capsys.readouterr().out.replace(' ', '')
  with pytest.raises(ConfigError, match=r"b2: expected unset for --optimizer sgd \(its "
                     r"hyperparameters: learning_rate, weight_decay, clip_norm, momentum, "
                     r"label_smoothing\), got 0.99"):
    TrainConfig.of(optimizer='sgd', b2=0.99).validate()
  with pytest.raises(ConfigError, match='momentum: expected unset for --optimizer adamw'):
    SweepConfig.of(momentum='0.8,0.9').validate()
  assert set(SweepConfig.of(optimizer='sgd', momentum='0.8,0.9').validate().specs()) == {
      'learning_rate', 'momentum', 'weight_decay', 'clip_norm', 'label_smoothing'}


def test_the_plot_draws_each_optimizers_schedule():
  config = {'learning_rate': 1.0, 'steps': 100, 'warmup_steps': 10}
  _, cosine = plot.learning_rates(config)
  _, constant = plot.learning_rates({**config, 'optimizer': 'schedule_free_adamw'})
  assert cosine[-1] == 0.0 and constant[-1] == 1.0 and max(cosine) == max(constant) == 1.0


def test_every_optimizers_hyperparameters_are_sweepable_members_of_one_population():
  """A sweep's values are the optimizer's rows, each injected in its state
  (pop_lib.init sets them there: shown on the table's last row; that a member trains
  as a standalone run with its values is tests/core/test_population.py's)."""
  for name, spec in OPTIMIZERS.items():
    rows = [r for r in hparams.HPARAMS if r.state in spec.hparams]
    values = {r.field: f'uniform:{r.default * 0.5:g}:{r.default:g}' for r in rows}
    config = SweepConfig.of(optimizer=name, members=2, **values).validate()
    seeds, swept = sweep.members(config)
    task = job_lib.build_task(config.base(seed=0), num_classes=10, input_shape=(8, 8, 1))
    assert set(swept) == set(spec.hparams) | {'label_smoothing'}, name
    assert set(swept) <= set(purax.core.hparams.names(task.abstract_state(SAMPLE))), name
  pop = jax.jit(pop_lib.init, static_argnums=0)(task, jax.vmap(jax.random.key)(seeds), swept,
                                                SAMPLE)
  state_values = purax.hyperparams(pop.state)
  for row in rows:
    np.testing.assert_array_equal(state_values[row.state], swept[row.state], row.state)


def test_a_schedule_free_run_evaluates_and_averages_its_average(tmp_path, capsys):
  """--optimizer schedule_free_adamw: eval/* (and so the best-k checkpoints
  ranked by it) at the average x, and --ema-decay averaging x (a decay of
  1e-6: the average is the last sample, x, to 1e-6) evaluated as it is (the
  export is Task.predict's, tests/core/test_task_eval_params.py)."""
  workdir = str(tmp_path / 'run')
  assert cli.main(['train', *SMALL, '--optimizer', 'schedule_free_adamw', '--ema-decay', '1e-6',
                   '--keep-best', '1', '--eval-every', '0', '--workdir', workdir]) == 0
  final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])['final']
  job, _ = runs.restore_run(workdir)
  with Checkpointer(f'{workdir}/checkpoints') as ckpt:
    tree, _, _ = ckpt.restore(job.abstract)
  state, average = tree['state'], tree['hooks']['ema']['params']
  x = job.task.evaluation_params(state)
  plain = dataclasses.replace(job.task, eval_params=None)
  at_x = runs.evaluate(plain, state.replace(params=x), job.data.eval(512))['loss']
  assert final['loss'] == pytest.approx(at_x, rel=1e-5)
  assert final['loss'] != pytest.approx(
      runs.evaluate(plain, state, job.data.eval(512))['loss'], rel=1e-3)    # y is not x
  for a, b in zip(jax.tree.leaves(average), jax.tree.leaves(x)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  records = [json.loads(line) for line in open(f'{workdir}/metrics.jsonl')]
  (ema,) = [r['eval_ema/loss'] for r in records if 'eval_ema/loss' in r]
  assert ema == pytest.approx(at_x, rel=1e-4)
