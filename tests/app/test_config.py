"""TrainConfig: the saved config records the model sizes trained; resuming
compares computation-changing fields, with old runs' unset sizes read as the
model's defaults."""

import dataclasses

import pytest

from purax import ConfigError
from purax.app.config import TrainConfig
from purax.nn.transformer import DecoderLM, TransformerEncoder


@pytest.mark.parametrize('model, cls', [('lm', DecoderLM), ('transformer', TransformerEncoder)])
def test_resolved_config_records_the_model_default_sizes(model, cls):
  config = TrainConfig.of(model=model, num_layers=3, workdir='w').resolved()
  defaults = {f.name: f.default for f in dataclasses.fields(cls)}
  assert (config.model.d_model, config.model.num_layers, config.model.num_heads) == (
      defaults['d_model'], 3, defaults['num_heads'])
  assert TrainConfig.from_json(config.to_json()) == config


def test_sizes_stay_unset_for_models_without_them():
  config = TrainConfig.of(model='cnn', workdir='w').resolved()
  assert (config.model.d_model, config.model.num_layers, config.model.num_heads) == (None, None, None)


def test_a_run_saved_with_unset_sizes_resumes_with_the_same_sizes_only():
  saved = TrainConfig.of(model='lm', workdir='w')                 # as older runs saved it
  TrainConfig.of(model='lm', workdir='w').resolved().check_resumable(saved)
  TrainConfig.of(model='lm', workdir='w', d_model=128).check_resumable(saved)
  with pytest.raises(ConfigError, match=r"d_model: expected 128 \(as in the run being resumed"):
    TrainConfig.of(model='lm', workdir='w', d_model=64).check_resumable(saved)


def test_a_data_file_path_is_saved_absolute_and_old_relative_runs_still_resume(tmp_path,
                                                                             monkeypatch):
  monkeypatch.chdir(tmp_path)
  config = TrainConfig.of(model='lm', dataset='text:notes.txt').resolved()
  assert config.data.name == f'text:{tmp_path}/notes.txt'
  assert config.run.workdir.startswith('runs/text_notes.txt-lm-')   # named as typed
  TrainConfig.of(model='lm', dataset='text:notes.txt', workdir=config.run.workdir).resolved() \
      .check_resumable(TrainConfig.of(model='lm', dataset='text:notes.txt'))   # an old run
  with pytest.raises(ConfigError, match='dataset: expected'):
    TrainConfig.of(model='lm', dataset='text:other.txt').check_resumable(config)


@pytest.mark.parametrize('text, match', [
    ('\x00\xff garbage', r'config.json: expected a JSON object, got unreadable text'),
    ('[1, 2]', r'config.json: expected a JSON object, got list'),
    ('{"dataset": "digits", "steps": 5, "batch_size": 8, "seed": 0, "learning_rate": 0.1}',
     r"config.json: expected the fields \['model'\], got \['model'\] missing"),
    ('{"model": "mlp", "dataset": "digits", "steps": "5", "batch_size": 8, "seed": 0, '
     '"learning_rate": 0.1}', r"steps: expected int, got '5' \(str\)"),
    ('{"model": "mlp", "dataset": "digits", "steps": 5, "batch_size": 8, "seed": 0, '
     '"learning_rate": 0.1, "progress": 1}', r'progress: expected bool, got 1 \(int\)'),
    ('{"model": "mlp", "steps": true}', r'steps: expected int, got True \(bool\)'),
    ('{"model": "mlp", "steps_per_call": "fast"}',
     r"steps_per_call: expected int or 'auto', got 'fast' \(str\)"),
])
def test_a_tampered_config_json_is_a_named_error(text, match):
  """Issue 13.7: garbage bytes, wrong types, a missing model."""
  with pytest.raises(ConfigError, match=match):
    TrainConfig.from_json(text)


@pytest.mark.parametrize('field, value, match', [
    ('steps', 2 ** 31, r'steps: expected >= 1 and < 2\*\*31, got 2147483648'),
    ('seed', 2 ** 63, r'seed: expected in \[0, 2\*\*32\)'),
    ('num_classes', 2 ** 40, r'num_classes: expected in \[2, 16777216\] or unset'),
    ('learning_rate', float('nan'), r'learning_rate: expected a finite value in \(0, 10\], got nan'),
    ('learning_rate', 1e30, r'learning_rate: expected a finite value in \(0, 10\]'),
    ('weight_decay', float('inf'), r'weight_decay: expected a finite value in \[0, 1\], got inf'),
    ('weight_decay', 5.0, r'weight_decay: expected a finite value in \[0, 1\], got 5.0'),
    ('loss_scale', float('inf'), r'loss_scale: expected in \[1, 2\*\*24\], got inf'),
    ('loss_scale', 2.0 ** 40, r'loss_scale: expected in \[1, 2\*\*24\]'),
    ('clip_norm', 0.0, r'clip_norm: expected a finite value in \(0, inf\) \(gradients are rescaled '
                       r'to at most this norm: 0 would zero them\), got 0.0'),
    ('b2', 1.0, r'b2: expected a finite value in \[0, 1\), got 1.0'),
    ('d_model', 64, r"d_model: expected unset for --model cnn \(its options: dropout_rate\)"),
])
def test_overflowing_non_finite_and_absurd_values_are_refused(field, value, match):
  with pytest.raises(ConfigError, match=match):
    TrainConfig.of(**{field: value}).validate()


def test_precision_auto_is_recorded_as_the_policy_it_resolved_to_and_a_resume_compares_it(
    monkeypatch):
  from purax.core import precision
  assert TrainConfig().model.precision == 'auto'
  on_cpu = TrainConfig.of(model='lm', workdir='w').resolved()
  assert on_cpu.model.precision == 'fp32'
  assert TrainConfig.from_json(on_cpu.to_json()) == on_cpu
  monkeypatch.setattr(precision, 'platform', lambda: 'gpu')
  on_gpu = TrainConfig.of(model='lm', workdir='w').resolved()
  assert on_gpu.model.precision == 'bf16'
  monkeypatch.undo()
  # A run trained on a GPU, resumed on the CPU with the default: named, not
  # silently continued in another precision.
  with pytest.raises(ConfigError, match=r"precision: expected 'bf16' \(as in the run being "
                                        r"resumed.*got 'fp32'"):
    TrainConfig.of(model='lm', workdir='w').check_resumable(on_gpu)
  TrainConfig.of(model='lm', workdir='w', precision='bf16').check_resumable(on_gpu)
  # Runs written before: 'fp32' (the default then) resumes under 'auto' on the
  # CPU, and a spelled-out policy resumes under its preset's name.
  TrainConfig.of(model='lm', workdir='w').check_resumable(TrainConfig.of(model='lm',
                                                                         precision='fp32'))
  TrainConfig.of(model='lm', workdir='w', precision='bf16').check_resumable(TrainConfig.of(
      model='lm', precision='params=float32,compute=bfloat16,output=float32'))


def test_float8_matmuls_are_refused_for_a_model_without_them():
  TrainConfig.of(model='lm', precision='fp8').model.validate()
  with pytest.raises(ConfigError, match=r"precision: expected a policy without float8 matmuls "
                                        r"for --model mlp \(float8 matmuls: transformer, lm\)"):
    TrainConfig.of(model='mlp', precision='fp8').model.validate()


def test_the_spike_window_is_bounded_and_its_state_checked_against_the_memory(monkeypatch):
  """An absurd --spike-window is refused whatever the memory, naming what its
  state would need; with --spike-k (the guard on) a window whose state does
  not fit the memory available is refused by config validation, before any
  state exists (purax.plan.budget.expect_fits)."""
  with pytest.raises(ConfigError, match=r'^spike_window: expected an integer in \[2, 2\*\*24 = '
                     r'16777216\] \(steps of history\), got 1000000000, whose state would '
                     r'need 7.45 GiB per member$'):
    TrainConfig.of(spike_window=10 ** 9).validate()
  from purax.plan import budget
  monkeypatch.setattr(budget, 'available_bytes', lambda device=None: 100 * 2 ** 20)
  TrainConfig.of(spike_window=2 ** 24).validate()          # no guard: nothing allocated
  with pytest.raises(ConfigError, match=r'^spike_window: expected a window whose state fits in '
                     r'the 100.00 MiB available \(.*use a smaller --spike-window\), got '
                     r'16777216, needing 128.00 MiB \(float32 \[window, 2\]'):
    TrainConfig.of(spike_k=6.0, spike_window=2 ** 24).validate()
  TrainConfig.of(spike_k=6.0, spike_window=2 ** 20).validate()     # 8 MiB: fits


@pytest.mark.parametrize('options, match', [
    # A rollback beyond the run's start: its ring (rollback // check snapshots of the
    # state) was allocated before the first step, an out-of-memory error naming `step`.
    ({'steps': 20, 'spike_k': 6.0, 'spike_rollback': 10 ** 9},
     r'^spike_rollback: expected at most --steps=20 \(a rollback goes back at most to the '
     r"run's start; 0: off\), got 1000000000$"),
    # What a rollback does, given without a rollback: silently nothing.
    ({'spike_action': 'lower-lr'},
     r"^spike_action: expected 'skip-data' \(the default\) unless --spike-rollback is set "
     r"\(it says what a rollback does\), got 'lower-lr'$"),
    ({'spike_lr_scale': 0.5},
     r'^spike_lr_scale: expected 0.1 \(the default\) unless --spike-rollback is set with '
     r'--spike-action lower-lr \(the rate of a lowered replay\), got 0.5$'),
    ({'spike_k': 6.0, 'spike_rollback': 10, 'spike_lr_steps': 30},
     r'^spike_lr_steps: expected 0 \(the default\) unless --spike-rollback is set with '
     r'--spike-action lower-lr \(the steps of a lowered replay\), got 30$'),
])
def test_a_spike_rollback_option_that_cannot_act_is_refused(options, match):
  with pytest.raises(ConfigError, match=match):
    TrainConfig.of(**options).validate()
  TrainConfig.of(steps=20, spike_k=6.0, spike_rollback=20, spike_action='lower-lr',
                 spike_lr_scale=0.5, spike_lr_steps=30).validate()    # all of them: fine
