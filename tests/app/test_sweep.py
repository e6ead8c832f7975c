"""Sweeps: search specs, one compilation per sweep shape, the CLI end to end
(the grid and random draws: test_search.py; the options' checks:
test_sweep_config.py)."""

import json
import os

import jax
import purax
import numpy as np
import pytest

from purax import loop
from purax.app import cli, search, sweep
from purax.app import hparam_table as hparams
from purax.app.sweep import SweepConfig
from purax.core import population as P
from purax.core.errors import ConfigError
from purax.io import pipeline
from purax.core.metrics import zeros_of as zero_metrics
from purax.plan import PopulationPlan, train_step
from tests.helpers import compilations

from tests import helpers_population as tp


def test_specs_parse_and_malformed_specs_are_named():
  assert search.parse_spec('lr', '1e-4,3e-4') == (1e-4, 3e-4)
  assert search.parse_spec('lr', 'loguniform:1e-5:1e-2') == search.Uniform(1e-5, 1e-2, True)
  for text, match in (('loguniform:1e-5', r"--lr: expected 'v1,v2,...'.*got 'loguniform:1e-5'"),
                      ('1e-3,abc', r"--lr: expected .*got '1e-3,abc'"),
                      ('gauss:0:1', r"--lr: expected .*got 'gauss:0:1'"),
                      ('loguniform:0:1', r'--lr: expected LOW <= HIGH \(and LOW > 0')):
    with pytest.raises(ConfigError, match=match):
      search.parse_spec('lr', text)
  with pytest.raises(ConfigError, match=r"--learning-rate: expected values in \(0, 10\], got '-1e-3'"):
    hparams.parse_spec(hparams.BY_FIELD['learning_rate'], '-1e-3')
  with pytest.raises(ConfigError, match=r'--b2: expected values in \[0, 1\)'):
    hparams.parse_spec(hparams.BY_FIELD['b2'], '1.0')
  with pytest.raises(ConfigError, match=r"--seeds: expected comma-separated integers"):
    search.parse_seeds('0,x')
  specs = {'lr': (1e-3, 1e-2), 'weight_decay': search.Uniform(0.0, 0.1)}
  seeds, hp = search.members_from_specs(specs, (0, 1), 5, key=jax.random.key(0))
  assert seeds.tolist() == [0, 1, 0, 1, 0] and hp['lr'].tolist() == np.float32(
      [1e-3, 1e-3, 1e-2, 1e-2, 1e-3]).tolist() and hp['weight_decay'].shape == (5,)
  with pytest.raises(ConfigError, match='members: expected >= 1, got 0'):
    search.members_from_specs(specs, (0,), 0, key=jax.random.key(0))
  with pytest.raises(ConfigError, match=r'members: expected unset or 2 \(the grid size\)'):
    search.members_from_specs({'lr': (1e-3, 1e-2)}, (0,), 3, key=jax.random.key(0))
  with pytest.raises(ConfigError, match=r'members: expected a population size when a spec is '
                     r'random \(weight_decay\), got unset'):
    search.members_from_specs(specs, (0,), None, key=jax.random.key(0))


def test_second_sweep_with_other_values_compiles_nothing():
  def one_sweep(seeds, lrs, smoothing):
    pop = tp.pinit(tp.TASK, tp.keys(seeds), {'learning_rate': np.float32(lrs),
                                            'label_smoothing': np.float32(smoothing)}, tp.batch())
    hooks = purax.hooks.standard(eval_data=[tp.batch(9)], eval_every=2, log_every=2,
                                 progress=False, max_consecutive_skips=None)
    return loop.fit(tp.TASK, pop, [tp.batch(s) for s in range(4)], plan=PopulationPlan(tp.TASK),
                    hooks=hooks + [purax.hooks.PopulationEarlyStopping(patience=3)])
  one_sweep([0, 1, 2], [1e-3, 3e-3, 1e-2], [0.0, 0.1, 0.0])   # compiles the programs
  with compilations() as compiles:
    pop, history = one_sweep([5, 6, 7], [2e-2, 1e-4, 5e-4], [0.2, 0.0, 0.05])
  assert compiles == [], compiles
  assert [r['step'] for r in history] == [2, 4]        # a record per step written
  assert history[-1]['eval/loss'].shape == (3,)


def test_member_reads_its_own_seeds_batches_like_a_single_run():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(40, tp.FEATURES)).astype(np.float32)
  y = rng.integers(0, tp.CLASSES, size=40).astype(np.int32)
  seeds = np.int32([3, 4, 3])
  datasets = [pipeline.train_dataset(x, y, batch_size=tp.BATCH, seed=s, num_steps=3)
              for s in (3, 4)]
  pop = tp.pinit(tp.TASK, tp.keys(seeds), {'learning_rate': np.float32([1e-2, 1e-2, 3e-3])},
                 tp.batch())
  with jax.default_matmul_precision('highest'):
    pop, _ = loop.fit(tp.TASK, pop, sweep.SeedBatches(datasets),
                      plan=PopulationPlan(tp.TASK, np.int32([0, 1, 0])),
                      hooks=purax.hooks.standard(progress=False, max_consecutive_skips=None))
    for i, (seed, lr) in enumerate(zip(seeds, (1e-2, 1e-2, 3e-3))):
      state = tp.sinit(jax.random.key(seed), {'learning_rate': lr}, tp.batch())
      data = datasets[0 if seed == 3 else 1]
      acc = zero_metrics(lambda st, b: tp.TASK.step(st, b)[1], state, data[0])
      for s in range(3):   # purax.fit's own compiled step
        state, acc = train_step(tp.TASK, state, acc, data[s])
      np.testing.assert_allclose(P.member(pop, i).params['Dense_0']['kernel'],
                                 state.params['Dense_0']['kernel'], rtol=tp.RTOL, atol=tp.ATOL)


@pytest.mark.slow
def test_cli_grid_sweep_end_to_end_and_eval_of_the_best(tmp_path, capsys):
  workdir = str(tmp_path / 'grid')
  rc = cli.main(['sweep', '--lr', '1e-4,3e-4,1e-3', '--seeds', '0,1,2', '--steps', '12',
                 '--batch-size', '32', '--eval-every', '6', '--log-every', '6',
                 '--workdir', workdir, '--no-progress'])
  assert rc == 0
  out = capsys.readouterr().out
  assert 'members sorted by eval loss' in out
  summary = json.load(open(os.path.join(workdir, 'sweep.json')))
  losses = [m['eval_loss'] for m in summary['members']]
  assert len(losses) == 9 and losses == sorted(losses)
  assert {(m['seed'], m['learning_rate']) for m in summary['members']} == {
      (s, lr) for s in (0, 1, 2) for lr in (1e-4, 3e-4, 1e-3)}
  assert os.path.getsize(os.path.join(workdir, 'curves.png')) > 1000
  best = os.path.join(workdir, 'best')
  config = json.load(open(os.path.join(best, 'config.json')))
  assert config['optimizer']['learning_rate'] == summary['members'][0]['learning_rate']
  assert cli.main(['eval', '--workdir', best]) == 0
  evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])['eval']
  np.testing.assert_allclose(evaluated['loss'], summary['members'][0]['eval_loss'], rtol=1e-5)


@pytest.mark.slow
def test_cli_random_sweep_end_to_end(tmp_path, capsys):
  workdir = str(tmp_path / 'random')
  rc = cli.main(['sweep', '--lr', 'loguniform:1e-5:1e-2', '--members', '16', '--steps', '8',
                 '--batch-size', '32', '--eval-every', '0', '--log-every', '4',
                 '--patience', '1', '--workdir', workdir, '--no-progress'])
  assert rc == 0
  summary = json.load(open(os.path.join(workdir, 'sweep.json')))
  lrs = [m['learning_rate'] for m in summary['members']]
  assert len(lrs) == 16 and len(set(lrs)) == 16 and all(1e-5 <= v <= 1e-2 for v in lrs)
  assert os.path.isdir(os.path.join(workdir, 'best', 'checkpoints'))


@pytest.mark.parametrize('args, message', [
    (['--lr', 'loguniform:1e-5'], "--learning-rate: expected 'v1,v2,...'"),
    (['--lr', 'loguniform:1e-5:1e-2', '--members', '0'],
     'members: expected a population of 1 to 2**16 = 65536 members, got 0'),
    (['--seeds', '0,-1'], '--seeds: expected integers >= 0'),
    (['--lr', 'loguniform:1e-5:1e-2'], 'members: expected a population size (--members N) '
     'when a spec is random (--learning-rate), got unset'),
    (['--lr', '1e-3,2e-3,1e-3'], '--learning-rate: expected distinct values (a repeated value '
     "would train the same member twice), got '1e-3,2e-3,1e-3' (repeats 0.001)"),
    (['--steps', '0'], 'steps: expected >= 1 and < 2**31, got 0'),
    (['--pbt-fraction', '0.9'], r'pbt_fraction: expected in (0, 0.5], got 0.9'),
])
def test_bad_input_is_named_and_leaves_no_directory(tmp_path, capsys, args, message):
  workdir = tmp_path / 'bad'
  assert cli.main(['sweep', *args, '--workdir', str(workdir), '--no-progress']) == 2
  assert message in capsys.readouterr().err
  assert not workdir.exists()


def test_failure_midway_removes_the_sweep_directory(tmp_path, monkeypatch):
  from purax.app import report as sweep_report
  def boom(*a, **k):
    raise RuntimeError('disk full')
  # Training is not the point here: a trivial init, and the report fails.
  monkeypatch.setattr(sweep.pop_lib, 'init', lambda task, keys, hparams, batch: keys)
  monkeypatch.setattr(sweep, 'fit', lambda task, pop, *a, **k: (pop, []))
  monkeypatch.setattr(sweep_report, 'write', boom)
  workdir = tmp_path / 'midway'
  with pytest.raises(RuntimeError, match='disk full'):
    sweep.run(SweepConfig.of(learning_rate='1e-3,2e-3', steps=2, batch_size=16, eval_every=0,
                             workdir=str(workdir), progress=False))
  assert not workdir.exists()


def test_members_whose_states_do_not_fit_are_refused_before_the_population_is_made(
    tmp_path, monkeypatch):
  """Job level: members x the job's state (traced, not allocated) against the
  memory available (here 1 MiB), before purax.core.population.init runs."""
  from purax.plan import budget
  monkeypatch.setattr(budget, 'available_bytes', lambda device=None: 2 ** 20)
  monkeypatch.setattr(budget, 'ALWAYS_FITS', 0)
  monkeypatch.setattr(P, 'init', lambda *a, **k: pytest.fail('the population was made'))
  config = cli.parse(['sweep', '--model', 'mlp', '--lr', '1e-3,1e-2', '--seeds', '0,1',
                      '--steps', '2', '--workdir', str(tmp_path / 's')])
  with pytest.raises(ConfigError, match=r'^members: expected a population of 4 members that '
                     r'fits in the 1.00 MiB available \(.*use fewer members, or a smaller '
                     r'model\), got 4, needing [\d.]+ MiB \(4 x [\d.]+ MiB of state'):
    sweep.run(config)
  assert os.listdir(tmp_path) == []
RESUMED = ['--model', 'mlp', '--dataset', 'digits', '--lr', '1e-3,3e-3', '--seeds', '0,1',
           '--steps', '12', '--batch-size', '32', '--log-every', '4', '--eval-every', '6',
           '--patience', '3', '--no-progress']


@pytest.mark.slow
def test_a_sweep_stopped_by_sigint_resumes_with_the_same_command_bitwise(tmp_path):
  """SIGINT after the 7th step (between log points): exit 0 with a checkpoint;
  the same command resumes it and ends with sweep.json's members, its
  history and the best member's params bitwise those of a straight sweep; a
  changed option is refused by name."""
  from tests.helpers_signals import signal_at
  from tests.helpers_runs import final_tree, purax
  straight, resumed = tmp_path / 'straight', tmp_path / 'resumed'
  done = purax('sweep', *RESUMED, '--workdir', straight)
  assert done.returncode == 0, done.stderr[-3000:]
  stopped = signal_at('step:7', 'SIGINT', 'sweep', *RESUMED, '--workdir', resumed)
  assert stopped.returncode == 130, stopped.stderr[-3000:]
  assert json.loads(stopped.stdout.strip().splitlines()[-1]) == {
      'sweep': {'stopped_by': 'SIGINT', 'step': 7}}
  assert not (resumed / 'sweep.json').exists()
  done = purax('sweep', *RESUMED, '--workdir', resumed)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f'resuming sweep {resumed} from step 7' in done.stderr
  want, got = (json.loads((d / 'sweep.json').read_text()) for d in (straight, resumed))
  assert got['members'] == want['members']
  timing = ('steps_per_sec', 'compile_s')
  assert [{k: v for k, v in r.items() if k not in timing} for r in got['history']] == [
      {k: v for k, v in r.items() if k not in timing} for r in want['history']]
  (want_tree, _, want_step), (got_tree, _, got_step) = (final_tree(str(d / 'best'))
                                                        for d in (straight, resumed))
  assert got_step == want_step == 12
  for a, b in zip(jax.tree.leaves(got_tree['state']), jax.tree.leaves(want_tree['state'])):
    np.testing.assert_array_equal(a, b)
  again = purax('sweep', *RESUMED, '--workdir', resumed)       # finished: nothing trained
  assert again.returncode == 0 and 'is finished; nothing to train' in again.stderr
  other = purax('sweep', *RESUMED, '--steps', '13', '--workdir', resumed)
  assert other.returncode == 2
  assert ('purax: error: steps: expected 12, the value this sweep in '
          f'{resumed} was started with') in other.stderr, other.stderr[-2000:]
