"""Your own model, loss and data set on the command line, by import path
(``--model mypkg.nets:make_net``, ``--loss``, ``--dataset``): a run trains,
resumes, sweeps, tunes, exports and evaluates like one of a built-in model,
and each bad path is a named error before anything compiles."""

import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from purax.app import cli
from purax.app import job as job_lib
from purax.app.config import TrainConfig
from purax.core import lazy
from tests.helpers import compilations
from tests.helpers_runs import ENV

NETS = '''
import flax.linen as nn
import numpy as np
import optax
from flax import nnx

import purax


class Net(nn.Module):
  num_classes: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


def make_net(num_classes):
  return Net(num_classes)


class NnxNet(nnx.Module):
  def __init__(self, features, num_classes, rngs):
    self.dense = nnx.Linear(features, num_classes, rngs=rngs)

  def __call__(self, x):
    return self.dense(x.reshape(x.shape[0], -1))


def make_nnx(num_classes, input_shape, rngs):
  return NnxNet(int(np.prod(input_shape)), num_classes, rngs)


def not_a_model(num_classes):
  return [num_classes]


def load():
  x = np.random.default_rng(0).normal(size=(96, 5)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 1).astype(np.int32)
  return x[:64], y[:64], x[64:], y[64:]


@purax.loss_function(hparams={'temperature': 2.0})
def tempered(logits, batch, hparams):
  values = optax.softmax_cross_entropy_with_integer_labels(logits / hparams['temperature'],
                                                           batch['y'])
  return values, batch.get('weight'), {'max_logit': logits.max(-1)}
'''

TINY = ['--steps', '4', '--batch-size', '32', '--log-every', '2', '--eval-every', '4',
        '--no-progress']
MODEL = ['--model', 'mypkg.nets:make_net', '--dataset', 'digits']


@pytest.fixture(scope='module')
def user_dir(tmp_path_factory):
  """A package ``mypkg`` (``mypkg/nets.py``) on ``sys.path``, as PYTHONPATH puts it."""
  root = tmp_path_factory.mktemp('user')
  (root / 'mypkg').mkdir()
  (root / 'mypkg' / '__init__.py').write_text('')
  (root / 'mypkg' / 'nets.py').write_text(textwrap.dedent(NETS))
  sys.path.insert(0, str(root))
  yield root
  sys.path.remove(str(root))
  for name in [m for m in sys.modules if m == 'mypkg' or m.startswith('mypkg.')]:
    del sys.modules[name]


def purax_with(user_dir, *args):
  """``python -m purax ARGS`` in a fresh process with ``user_dir`` on PYTHONPATH,
  from another directory."""
  env = dict(ENV, PYTHONPATH=os.pathsep.join([str(user_dir), ENV['PYTHONPATH']]),
             JAX_PLATFORMS='cpu')
  done = subprocess.run([sys.executable, '-m', 'purax', *args], cwd=os.path.dirname(user_dir),
                        env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.splitlines()[-1])


def test_own_model_trains_resumes_exports_and_evals_in_fresh_processes(user_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  final = purax_with(user_dir, 'train', *MODEL, *TINY, '--workdir', workdir)['final']
  config = json.loads((tmp_path / 'run' / 'config.json').read_text())
  assert config['model']['name'] == 'mypkg.nets:make_net'        # recorded as given
  assert cli.main(['train', '--workdir', workdir, '--steps', '8']) == 0    # resumed
  steps = [json.loads(line)['step'] for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  assert max(steps) == 8 and 6 in steps
  assert cli.main(['export', '--workdir', workdir]) == 0
  assert os.path.isfile(os.path.join(workdir, 'export', 'predict.jaxexport'))
  evaluated = purax_with(user_dir, 'eval', '--workdir', workdir)['eval']   # imported again
  assert evaluated['examples'] == final['examples'] == 360
  assert evaluated['loss'] != final['loss']                      # the resumed run's


def test_own_model_sweeps_and_tunes_the_learning_rate(user_dir, tmp_path, capsys):
  workdir = tmp_path / 'sweep'
  assert cli.main(['sweep', '--lr', '1e-3,3e-3', *MODEL, '--loss', 'mypkg.nets:tempered', *TINY,
                   '--workdir', str(workdir)]) == 0     # a loss without label smoothing
  summary = json.loads((workdir / 'sweep.json').read_text())
  assert sorted(m['learning_rate'] for m in summary['members']) == pytest.approx([1e-3, 3e-3])
  best = TrainConfig.from_json((workdir / 'best' / 'config.json').read_text())
  assert best.model.name == 'mypkg.nets:make_net'
  assert cli.main(['tune', 'lr', *MODEL, '--steps', '8', '--batch-size', '32', '--num-lrs', '3',
                   '--workdir', str(tmp_path / 'lr')]) == 0
  assert '"suggestion"' in capsys.readouterr().out


def test_own_nnx_model_data_set_and_loss(user_dir, tmp_path):
  """An NNX factory taking ``rngs`` is built per key (two seeds, two inits);
  the data set's function and the loss's declared hyperparameter reach the run."""
  args = ['--model', 'mypkg.nets:make_nnx', '--dataset', 'mypkg.nets:load', '--loss',
          'mypkg.nets:tempered']
  workdir = tmp_path / 'run'
  assert cli.main(['train', *args, *TINY, '--workdir', str(workdir)]) == 0
  record = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert any('eval/max_logit' in r for r in record)                   # the user's loss
  assert any(r.get('eval/examples') == 32 for r in record)           # the user's 32 test rows
  config = TrainConfig.of(model='mypkg.nets:make_nnx', dataset='mypkg.nets:load',
                          loss='mypkg.nets:tempered').validate()
  task = job_lib.build_task(config, num_classes=3, input_shape=(5,))
  batch = {'x': np.zeros((2, 5), np.float32), 'y': np.zeros(2, np.int32)}
  a, b = (task.init(jax.random.key(seed), batch) for seed in (0, 1))
  assert not np.array_equal(a.params['dense']['kernel'], b.params['dense']['kernel'])
  assert float(a.hparams['temperature']) == 2.0


def test_the_current_directory_is_searched(tmp_path, monkeypatch):
  """As ``python -m purax`` finds ./mynets.py, so does the ``purax`` script."""
  (tmp_path / 'cwd_nets_for_purax.py').write_text('def make_net(num_classes):\n  return 1\n')
  monkeypatch.setattr(sys, 'path', [p for p in sys.path if p not in ('', str(tmp_path))])
  monkeypatch.chdir(tmp_path)
  assert lazy.user('cwd_nets_for_purax:make_net', 'model')(num_classes=3) == 1
  monkeypatch.delitem(sys.modules, 'cwd_nets_for_purax')


BAD = [
    (['--model', 'mypkg.nope:make_net'], "model: expected module 'mypkg.nope' to import (from "
     "sys.path, PYTHONPATH or the current directory), got ModuleNotFoundError: No module named "
     "'mypkg.nope'"),
    (['--model', 'mypkg.nets:make_nett'], "model: expected a name that mypkg.nets defines (did "
     "you mean make_net or make_nnx?), got 'make_nett' in 'mypkg.nets:make_nett'"),
    (['--model', 'mypkg.nets:not_a_model'], 'model: expected mypkg.nets:not_a_model('
     'num_classes=10) to return a flax.linen Module, a flax.nnx Module or a purax model'),
    (['--model', 'mypkg.nets.make_net'], "got 'mypkg.nets.make_net' (did you mean "
     "'mypkg.nets:make_net'?)"),
    (['--loss', 'mypkg.nets:tempred'], "loss: expected a name that mypkg.nets defines (did you "
     "mean tempered?), got 'tempred'"),
    (['--loss', 'mypkg.nets.tempered'], "loss: expected one of ('classification', "
     "'language_model', 'regression') or MODULE:FUNCTION"),
    (['--dataset', 'mypkg.nets:lod'], "dataset: expected a name that mypkg.nets defines (did "
     "you mean load?), got 'lod'"),
    (['--dataset', 'mypkg.nets.load'], "got 'mypkg.nets.load' (did you mean 'mypkg.nets:load'?)"),
]


@pytest.mark.parametrize('args, message', BAD, ids=[' '.join(a) for a, _ in BAD])
def test_a_bad_path_is_named_before_anything_compiles(user_dir, tmp_path, capsys, args, message):
  workdir = tmp_path / 'never'
  parser = False
  with compilations() as compiled:
    try:
      status = cli.main(['train', *TINY, '--workdir', str(workdir), *args])
    except SystemExit as e:     # the parser's own answer
      status, parser = e.code, True
  err = re.sub(r'\s+', ' ', re.sub(r'[│╭╰─╮╯]', ' ', capsys.readouterr().err))
  assert status == 2 and message in err, err
  assert compiled == [] and not workdir.exists()
  # --model's form is checked by the parser (no jax imported: tests/app/test_cli.py)
  assert parser == (args[0] == '--model' and ':' not in args[1])
  if args[1] == 'mypkg.nets:not_a_model':
    assert err.rstrip().endswith('got list'), err
