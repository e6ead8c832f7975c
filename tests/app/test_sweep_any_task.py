"""`purax sweep` takes every task `purax train` takes (a language model on
pystdlib, a mesh, a precision), and member i is the standalone `purax train`
run of member i's hyperparameters and seed."""

import json
import os

import jax
import numpy as np
import pytest

from purax.app import cli, runs
from purax.app.sweep import SweepConfig

LM = ['--model', 'lm', '--dataset', 'pystdlib', '--steps', '4', '--batch-size', '4',
      '--seq-len', '16', '--d-model', '16', '--num-layers', '1', '--num-heads', '2',
      '--log-every', '2', '--eval-every', '4', '--eval-batch-size', '64', '--warmup-steps', '2']
MLP = ['--model', 'mlp', '--steps', '6', '--batch-size', '16', '--log-every', '3',
       '--eval-every', '6', '--warmup-steps', '2']


def _sweep(tmp_path, capsys, args):
  workdir = str(tmp_path / 'sweep')
  assert cli.main(['sweep', *args, '--workdir', workdir, '--no-progress']) == 0, \
      capsys.readouterr().err
  capsys.readouterr()
  with open(os.path.join(workdir, 'sweep.json')) as f:
    return workdir, json.load(f)


def _standalone(tmp_path, capsys, args, member, name):
  """`purax train` with member's seed and hyperparameters; its final metrics and params."""
  workdir = str(tmp_path / name)
  hp = {'--learning-rate': member['learning_rate'], '--weight-decay': member['weight_decay'],
        '--label-smoothing': member['label_smoothing'], '--seed': member['seed']}
  flags = [str(x) for kv in hp.items() for x in kv]
  assert cli.main(['train', *args, *flags, '--workdir', workdir, '--no-progress']) == 0, \
      capsys.readouterr().err
  final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])['final']
  _, state = runs.restore_run(workdir, need_data=False)
  return final, state


def _check_members(tmp_path, capsys, train_args, summary, workdir, rtol, others=1):
  """The best member and (``others=1``) the last-ranked one (of another seed
  when there is one), each against its own `purax train` run (two runs at
  most keep the suite short; the mesh and bf16 sweeps check the best only,
  the language-model sweep both)."""
  best, *rest = summary['members']
  other = [m for m in rest if m['seed'] != best['seed']] or rest
  for member in [best, *other[-1:][:others]]:
    final, state = _standalone(tmp_path, capsys, train_args, member, f"m{member['member']}")
    np.testing.assert_allclose(final['loss'], member['eval_loss'], rtol=rtol)
    if member['rank'] == 1:   # the best member is saved as a run: its params too
      _, best = runs.restore_run(os.path.join(workdir, 'best'), need_data=False)
      jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6),
                   best.params, state.params)


@pytest.mark.slow
def test_language_model_sweep_member_equals_its_standalone_run(tmp_path, capsys):
  workdir, summary = _sweep(tmp_path, capsys, [*LM, '--lr', '1e-3,3e-3', '--seeds', '0,1'])
  assert len(summary['members']) == 4 and summary['swept'] == ['learning_rate']
  assert {(m['seed'], m['learning_rate']) for m in summary['members']} == {
      (s, lr) for s in (0, 1) for lr in (1e-3, 3e-3)}
  assert 'eval_bits_per_byte' in summary['members'][0]
  _check_members(tmp_path, capsys, LM, summary, workdir, rtol=1e-5)


@pytest.mark.slow
def test_sweep_on_a_mesh_member_equals_its_standalone_mesh_run(tmp_path, capsys):
  args = [*MLP, '--mesh', 'data=8']      # the suite's 8 host devices
  workdir, summary = _sweep(tmp_path, capsys, [*args, '--lr', '1e-3,3e-3'])
  _check_members(tmp_path, capsys, args, summary, workdir, rtol=1e-5, others=0)


@pytest.mark.slow
def test_sweep_in_bf16_and_over_label_smoothing_names_it(tmp_path, capsys):
  args = [*MLP, '--precision', 'bf16']
  workdir = str(tmp_path / 'sweep')
  assert cli.main(['sweep', *args, '--label-smoothing', '0.0,0.2', '--lr', '2e-3,4e-3',
                   '--workdir', workdir, '--no-progress']) == 0
  out = capsys.readouterr().out
  head = out.splitlines()[1].split()
  assert 'ls' in head and 'lr' in head           # the table names every swept hyperparameter
  with open(os.path.join(workdir, 'sweep.json')) as f:
    summary = json.load(f)
  assert summary['swept'] == ['learning_rate', 'label_smoothing']
  with open(os.path.join(workdir, 'best', 'config.json')) as f:
    best = json.load(f)
  assert best['model']['precision'] == 'bf16'
  _check_members(tmp_path, capsys, args, summary, workdir, rtol=1e-5, others=0)


@pytest.mark.parametrize('flag', ['--checkpoint-every', '--seed', '--dry-run', '--histograms',
                                  '--keep-last'])
def test_sweep_has_no_options_it_would_ignore(tmp_path, capsys, flag):
  with pytest.raises(SystemExit) as e:
    cli.main(['sweep', flag, '5', '--workdir', str(tmp_path / 's')])
  assert e.value.code == 2
  assert 'Unrecognized' in capsys.readouterr().err
  assert not (tmp_path / 's').exists()


def test_members_share_the_base_sections():
  config = SweepConfig.of(learning_rate='1e-3,3e-3', weight_decay='uniform:0:0.1',
                          model='transformer', dataset='mnist1d', d_model=32)
  base = config.base({'learning_rate': 3e-3, 'weight_decay': 0.05}, seed=4, workdir='w')
  assert (base.model.name, base.model.d_model, base.data.name) == ('transformer', 32, 'mnist1d')
  assert (base.optimizer.learning_rate, base.optimizer.weight_decay, base.run.seed) == (
      3e-3, 0.05, 4)
  assert base.optimizer.warmup_steps == config.optimizer.warmup_steps
  base.validate()
