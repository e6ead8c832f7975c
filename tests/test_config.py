"""TrainConfig: the saved config records the model sizes trained; resuming
compares computation-changing fields, with old runs' unset sizes read as the
model's defaults."""

import dataclasses

import pytest

from purax import ConfigError
from purax.config import TrainConfig
from purax.nn.transformer import DecoderLM, TransformerEncoder


@pytest.mark.parametrize('model, cls', [('lm', DecoderLM), ('transformer', TransformerEncoder)])
def test_resolved_config_records_the_model_default_sizes(model, cls):
  config = TrainConfig(model=model, num_layers=3, workdir='w').resolved()
  defaults = {f.name: f.default for f in dataclasses.fields(cls)}
  assert (config.d_model, config.num_layers, config.num_heads) == (
      defaults['d_model'], 3, defaults['num_heads'])
  assert TrainConfig.from_json(config.to_json()) == config


def test_sizes_stay_unset_for_models_without_them():
  config = TrainConfig(model='cnn', workdir='w').resolved()
  assert (config.d_model, config.num_layers, config.num_heads) == (None, None, None)


def test_a_run_saved_with_unset_sizes_resumes_with_the_same_sizes_only():
  saved = TrainConfig(model='lm', workdir='w')                 # as older runs saved it
  TrainConfig(model='lm', workdir='w').resolved().check_resumable(saved)
  TrainConfig(model='lm', workdir='w', d_model=128).check_resumable(saved)
  with pytest.raises(ConfigError, match=r"d_model: expected 128 \(as in the run being resumed"):
    TrainConfig(model='lm', workdir='w', d_model=64).check_resumable(saved)


def test_a_data_file_path_is_saved_absolute_and_old_relative_runs_still_resume(tmp_path,
                                                                             monkeypatch):
  monkeypatch.chdir(tmp_path)
  config = TrainConfig(model='lm', dataset='text:notes.txt').resolved()
  assert config.dataset == f'text:{tmp_path}/notes.txt'
  assert config.workdir.startswith('runs/text_notes.txt-lm-')   # named as typed
  TrainConfig(model='lm', dataset='text:notes.txt', workdir=config.workdir).resolved() \
      .check_resumable(TrainConfig(model='lm', dataset='text:notes.txt'))   # an old run
  with pytest.raises(ConfigError, match='dataset: expected'):
    TrainConfig(model='lm', dataset='text:other.txt').check_resumable(config)


@pytest.mark.parametrize('text, match', [
    ('\x00\xff garbage', r'config.json: expected a JSON object, got unreadable text'),
    ('[1, 2]', r'config.json: expected a JSON object, got list'),
    ('{"dataset": "digits", "steps": 5, "batch_size": 8, "seed": 0, "learning_rate": 0.1}',
     r"config.json: expected the fields \['model'\], got \['model'\] missing"),
    ('{"model": "mlp", "dataset": "digits", "steps": "5", "batch_size": 8, "seed": 0, '
     '"learning_rate": 0.1}', r"steps: expected int, got '5' \(str\)"),
    ('{"model": "mlp", "dataset": "digits", "steps": 5, "batch_size": 8, "seed": 0, '
     '"learning_rate": 0.1, "progress": 1}', r'progress: expected bool, got 1 \(int\)'),
])
def test_a_tampered_config_json_is_a_named_error(text, match):
  """Issue 13.7: garbage bytes, wrong types, a missing model."""
  with pytest.raises(ConfigError, match=match):
    TrainConfig.from_json(text)


@pytest.mark.parametrize('field, value, match', [
    ('steps', 2 ** 31, r'steps: expected < 2\*\*31, got 2147483648'),
    ('seed', 2 ** 63, r'seed: expected in \[0, 2\*\*32\)'),
    ('num_classes', 2 ** 40, r'num_classes: expected < 2\*\*31'),
    ('learning_rate', float('nan'), 'learning_rate: expected a finite number, got nan'),
    ('learning_rate', 1e30, r'learning_rate: expected <= 10'),
    ('weight_decay', float('inf'), 'weight_decay: expected a finite number, got inf'),
    ('weight_decay', 5.0, r'weight_decay: expected in \[0, 1\], got 5.0'),
    ('loss_scale', float('inf'), 'loss_scale: expected a finite number, got inf'),
    ('loss_scale', 2.0 ** 40, r'loss_scale: expected <= 2\*\*24'),
    ('clip_norm', 0.0, 'clip_norm: expected > 0, got 0.0'),
])
def test_overflowing_non_finite_and_absurd_values_are_refused(field, value, match):
  with pytest.raises(ConfigError, match=match):
    TrainConfig(**{field: value}).validate()
