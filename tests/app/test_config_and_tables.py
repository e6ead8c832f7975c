"""The application layer's tables and sections: one row adds a model, a data
set or a hyperparameter; old run directories resume; a run trains longer."""

import ast
import dataclasses
import json
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purax
from purax.app import cli, data, job, models, runs
from purax.app import hparam_table as hparams
from purax.app.config import FORMAT, TrainConfig
from purax.app.optimizer_table import OPTIMIZERS, SCHEDULE_ROWS
from purax.app.sweep import SweepConfig
from purax.core.errors import ConfigError

FIXTURES = pathlib.Path(__file__).parent.parent / 'fixtures'
SMALL = ['--model', 'mlp', '--steps', '8', '--batch-size', '16', '--log-every', '4',
         '--eval-every', '8', '--checkpoint-every', '4', '--no-progress']


def test_sections_follow_the_hyperparameter_table():
  fields = [f.name for f in dataclasses.fields(hparams.OptimizerConfig)]
  assert fields == [r.field for r in hparams.HPARAMS] + list(hparams.SETTINGS)
  assert [f.name for f in dataclasses.fields(hparams.OptimizerSearch)] == fields
  values = hparams.OptimizerConfig().values()
  assert values == {r.state: r.default for r in hparams.HPARAMS}
  # Every table row reaches the state under its state name, with every
  # optimizer of the table that takes it (and only those take it).
  for name in OPTIMIZERS:
    state_names = set(purax.core.hparams.names(jax.eval_shape(
        _task(TrainConfig.of(model='mlp', optimizer=name)).init, jax.random.key(0),
        data.sample_batch((8, 8, 1), np.float32, (), np.int32, 2))))
    taken = {r.state for r in hparams.HPARAMS if hparams.takes(name, r)}
    assert taken <= state_names, name
    assert not {r.state for r in hparams.HPARAMS} - taken & state_names - {'eps'}, name
  assert {r.state for r in hparams.HPARAMS} == {s for o in OPTIMIZERS.values()
                                                for s in o.hparams} | {'label_smoothing'} | {
                                                    s for rows in SCHEDULE_ROWS.values()
                                                    for s in rows}
  # the command line's schedule rows are the core's injected schedule hyperparameters
  assert SCHEDULE_ROWS == dict(purax.core.optim.SCHEDULE_HPARAMS)


def _task(config):
  return job.build_task(config, num_classes=10, input_shape=(8, 8, 1))


@pytest.mark.parametrize('row', hparams.HPARAMS, ids=lambda r: r.field)
def test_each_bound_is_checked_once_for_train_sweep_and_pbt(row):
  b = row.bounds
  outside = b.low if b.low_open else (b.high if b.high_open else b.high * 2 + 1)
  if row.unset:     # its default (outside the bounds) means unset: another value outside
    outside = -5.0
  schedule = next((s for s, rows in SCHEDULE_ROWS.items() if row.state in rows), 'default')
  optimizer = next(name for name in OPTIMIZERS if hparams.takes(name, row, schedule))
  with pytest.raises(ConfigError, match=f'{row.field}: expected a finite value in'):
    TrainConfig.of(optimizer=optimizer, schedule=schedule, **{row.field: outside}).validate()
  inside = row.default if not row.unset else b.clip()[0]
  with pytest.raises(ConfigError, match=f"--{row.field.replace('_', '-')}: expected values in"):
    SweepConfig.of(optimizer=optimizer, schedule=schedule,
                   **{row.field: f'{inside},{outside}'}).validate()
  lo, hi = row.clip_bounds()
  assert row.contains(lo) and row.contains(hi)


def test_a_data_set_row_is_all_the_cli_needs(tmp_path, monkeypatch):
  rng = np.random.default_rng(0)
  arrays = purax.io.datasets.ArrayDataset(
      'blobs', rng.normal(size=(64, 5)).astype(np.float32), rng.integers(0, 3, 64).astype(np.int32),
      rng.normal(size=(16, 5)).astype(np.float32), rng.integers(0, 3, 16).astype(np.int32), 3)
  monkeypatch.setitem(purax.io.datasets.DATASETS, 'blobs', purax.io.datasets.Source(
      lambda name, **options: arrays, 'three gaussian blobs'))
  final = runs.train(TrainConfig.of(model='mlp', dataset='blobs', steps=3, batch_size=8,
                                    eval_every=0, workdir=str(tmp_path / 'r'), progress=False))
  assert final['examples'] == 16


def test_a_run_written_before_the_sections_resumes(tmp_path, capsys):
  """config.json of format 1 (purax 0.1's flat TrainConfig, a fixture written by it)."""
  workdir = tmp_path / 'old'
  # Trained as purax 0.1 trained: weight decay on every leaf (what a config
  # without weight_decay_mask reads as).
  assert cli.main(['train', *SMALL, '--weight-decay-mask', 'all', '--workdir', str(workdir)]) == 0
  old = (FIXTURES / 'config_v1_mlp.json').read_text().replace('WORKDIR', str(workdir))
  assert '"format"' not in old and json.loads(old)['model'] == 'mlp'
  (workdir / 'config.json').write_text(old)
  capsys.readouterr()
  # Resumed (and trained longer): the old config is read, then saved in format 2.
  assert cli.main(['train', '--workdir', str(workdir), '--steps', '12']) == 0
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])['final']['examples'] == 360
  saved = json.loads((workdir / 'config.json').read_text())
  assert saved['format'] == FORMAT and saved['run']['steps'] == 12


# The run of tests/fixtures/config_v2_lm_before_scan_layers.json (written by
# purax at commit 0799598, before scan_layers was recorded).
TINY_LM = ['--model', 'lm', '--dataset', 'pystdlib', '--steps', '4', '--batch-size', '4',
           '--seq-len', '16', '--d-model', '16', '--num-layers', '2', '--num-heads', '2',
           '--log-every', '2', '--eval-every', '0', '--checkpoint-every', '2',
           '--warmup-steps', '2', '--no-progress']
# Its parameters as that purax restored them: layers scanned, a leading [2] axis.
OLD_LM_PARAMS = {
    'embed': {'embedding': (256, 16)}, 'final_norm': {'bias': (16,), 'scale': (16,)},
    'layers': {'attention': {'out': (2, 2, 8, 16), 'out_bias': (2, 16),
                             'qkv': (2, 16, 3, 2, 8), 'qkv_bias': (2, 3, 2, 8)},
               'mlp': {'bi': (2, 64), 'bo': (2, 16), 'wi': (2, 16, 64), 'wo': (2, 64, 16)},
               'norm1': {'bias': (2, 16), 'scale': (2, 16)},
               'norm2': {'bias': (2, 16), 'scale': (2, 16)}}}


def _param_shapes(workdir):
  _, state = runs.restore_run(str(workdir), need_data=False)
  return jax.tree.map(np.shape, state.params)


@pytest.mark.parametrize('model, layers, flag, recorded', [
    ('lm', 2, None, False), ('lm', 25, None, True), ('transformer', 30, None, True),
    ('lm', 12, None, False), ('lm', 30, False, False), ('transformer', 2, True, True),
    ('mlp', None, None, None)])
def test_the_resolved_config_records_whether_layers_are_scanned(model, layers, flag, recorded):
  config = TrainConfig.of(model=model, num_layers=layers, scan_layers=flag, workdir='w',
                          dataset='pystdlib' if model == 'lm' else 'digits').validate().resolved()
  assert config.model.scan_layers is recorded
  assert TrainConfig.from_json(config.to_json()) == config


def test_scan_layers_is_refused_by_name_for_a_model_without_layers():
  for value in (True, False):
    with pytest.raises(ConfigError, match=r'scan_layers: expected unset for --model mlp '
                       r'\(its options: dropout_rate\), got ' + str(value)):
      TrainConfig.of(model='mlp', scan_layers=value).validate()


@pytest.mark.slow
def test_a_run_records_its_layer_layout_and_resumes_with_it(tmp_path, capsys, monkeypatch):
  """The default rule's choice is saved, so a later rule cannot change a run's params."""
  workdir = tmp_path / 'enc'
  # The encoder classifier on digits: the same stack (and rule) as the LM, cheaper data.
  one_layer = ['--model', 'transformer', '--d-model', '16', '--num-layers', '1',
               '--num-heads', '2', '--steps', '2', '--batch-size', '8', '--log-every', '2',
               '--eval-every', '0', '--checkpoint-every', '2', '--warmup-steps', '1',
               '--no-progress']
  assert cli.main(['train', *one_layer, '--workdir', str(workdir)]) == 0
  assert json.loads((workdir / 'config.json').read_text())['model']['scan_layers'] is False
  # The rule changes (now: scan above 0 layers); the run resumes unrolled as it was trained.
  monkeypatch.setattr(purax.nn.transformer, 'SCAN_LAYERS_ABOVE', 0)
  assert TrainConfig.of(model='transformer', num_layers=1).resolved().model.scan_layers is True
  capsys.readouterr()
  assert cli.main(['train', '--workdir', str(workdir), '--steps', '4']) == 0, \
      capsys.readouterr().err
  saved = json.loads((workdir / 'config.json').read_text())
  assert saved['model']['scan_layers'] is False and saved['run']['steps'] == 4
  assert 'layers_0' in _param_shapes(workdir)


def test_an_lm_config_written_before_scan_layers_builds_the_scanned_params():
  """A config.json without scan_layers (fixture written by purax at 0799598, whose
  layers were always scanned) builds the scanned params that run was trained
  with (OLD_LM_PARAMS, as that purax restored them), so its checkpoints restore;
  the CLI resume itself is ``test_a_run_records_its_layer_layout_and_resumes_with_it``'s."""
  old = (FIXTURES / 'config_v2_lm_before_scan_layers.json').read_text()
  assert 'scan_layers' not in old and json.loads(old)['model']['num_layers'] == 2
  config = TrainConfig.from_json(old.replace('WORKDIR', 'w')).resolved()
  assert config.model.scan_layers is True
  model = models.build(config.model, num_classes=256, seq_len=config.data.seq_len)
  tokens = jax.ShapeDtypeStruct((1, config.data.seq_len), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.key(0), tokens)['params']
  assert jax.tree.map(np.shape, nn.unbox(params)) == OLD_LM_PARAMS


def test_a_format_1_lm_config_reads_as_scanned():
  """purax 0.1's flat config.json had no scan_layers; its LM layers were scanned."""
  flat = json.loads((FIXTURES / 'config_v1_mlp.json').read_text())
  assert TrainConfig.from_json(json.dumps(flat)).model.scan_layers is None   # no layers
  lm = TrainConfig.from_json(json.dumps({**flat, 'model': 'lm', 'dataset': 'pystdlib'}))
  assert lm.model.scan_layers is True
  assert lm.validate().resolved().model.scan_layers is True
  recorded = TrainConfig.from_json(json.dumps({**flat, 'model': 'lm', 'scan_layers': False}))
  assert recorded.model.scan_layers is False


def test_a_config_from_a_newer_purax_is_refused_naming_the_version():
  text = json.dumps({'format': FORMAT + 1, 'model': {'name': 'mlp'}})
  with pytest.raises(ConfigError, match=rf'config.json format: expected 1 or {FORMAT} \(this '
                     rf'is purax {purax.__version__}; a newer purax wrote this run\), got '
                     rf'{FORMAT + 1}'):
    TrainConfig.from_json(text)


def _lr_at_end(workdir):
  job, state = runs.restore_run(str(workdir), need_data=False)
  return int(state.step), float(purax.hyperparams(state, job.task.tx)['learning_rate'])


def test_train_longer_replans_the_decay_or_keeps_it(tmp_path, capsys):
  for name in ('replan', 'keep'):
    assert cli.main(['train', *SMALL, '--warmup-steps', '2', '--workdir',
                     str(tmp_path / name)]) == 0
    assert _lr_at_end(tmp_path / name) == (8, 0.0)      # the cosine has decayed to 0
  assert cli.main(['train', '--workdir', str(tmp_path / 'replan'), '--steps', '12']) == 0
  step, lr = _lr_at_end(tmp_path / 'replan')
  assert step == 12 and lr == 0.0
  # Kept: --decay-steps 8 spans the old schedule; the 4 more steps run at its end value (0),
  # so the params do not move.
  keep = tmp_path / 'keep'
  before = runs.restore_run(str(keep), need_data=False)[1].params
  assert cli.main(['train', '--workdir', str(keep), '--steps', '12', '--decay-steps', '8']) == 0
  after = runs.restore_run(str(keep), need_data=False)[1].params
  jax.tree.map(np.testing.assert_array_equal, before, after)
  replanned = runs.restore_run(str(tmp_path / 'replan'), need_data=False)[1].params
  assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, before, replanned)))
  capsys.readouterr()
  assert cli.main(['train', '--workdir', str(keep), '--steps', '6']) == 2
  assert 'steps: expected >= 12 (the step of the newest checkpoint' in capsys.readouterr().err


#: The modules that may import by name at run time (importlib.import_module,
#: __import__): the one resolver of purax's import paths, and the ONNX
#: exporter for jax2onnx's own plugin modules.
DYNAMIC_IMPORTS = {'core/lazy.py', 'io/onnx_export.py'}


def test_no_package_import_inside_a_function():
  """Package-internal imports sit at the top of modules (none inside functions);
  an import deferred to its use is an import path resolved by purax.core.lazy
  (named at the top of the module), the only place that imports by name."""
  root = pathlib.Path(purax.__file__).parent
  found = []
  for path in root.rglob('*.py'):
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
      if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for node in ast.walk(fn):
          module = (node.module or '') if isinstance(node, ast.ImportFrom) else (
              ' '.join(a.name for a in node.names) if isinstance(node, ast.Import) else '')
          if module == 'purax' or module.startswith('purax.'):
            found.append(f'{path.relative_to(root)}:{node.lineno} {module}')
    if str(path.relative_to(root)) not in DYNAMIC_IMPORTS:
      found += [f'{path.relative_to(root)}:{node.lineno} import by name'
                for node in ast.walk(tree) if isinstance(node, ast.Call)
                and (getattr(node.func, 'attr', None) == 'import_module'
                     or getattr(node.func, 'id', None) in ('__import__', 'import_module'))]
  assert found == []
