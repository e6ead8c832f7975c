"""The command line end to end, and its errors (nothing written on bad input)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from purax.app import cli
from purax.app.config import TrainConfig


def run(*args):
  return cli.main(list(args))


def test_default_train_reaches_97_percent_on_digits_and_writes_the_run_directory(tmp_path, capsys):
  workdir = tmp_path / 'run'
  assert run('train', '--workdir', str(workdir), '--no-progress') == 0
  names = set(os.listdir(workdir))
  assert {'config.json', 'metrics.jsonl', 'checkpoints', 'final_metrics.json'} <= names
  assert any(n.startswith('events.out.tfevents') for n in names)
  config = TrainConfig.from_json((workdir / 'config.json').read_text()).flat()
  assert config['model'] == 'cnn' and config['dataset'] == 'digits'
  records = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  final = [r for r in records if 'eval/accuracy' in r][-1]
  assert final['step'] == config['steps']
  assert final['eval/accuracy'] >= 0.97
  assert final['eval/examples'] == 360
  # purax eval restores the checkpoint and reproduces the final evaluation.
  capsys.readouterr()
  assert run('eval', '--workdir', str(workdir)) == 0
  out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  np.testing.assert_allclose(out['eval']['accuracy'], final['eval/accuracy'], rtol=1e-6)


def test_the_readmes_ema_command_averages_as_well_as_the_last_params(tmp_path):
  """Issue 27.1, the README's command at 200 steps: the warmed-up EMA evaluates
  within a point of the params (the plain average from the initial params gave
  0.4389 here, the debiased one 0.9611); --ema-decay and --histograms are the
  rows of job.HOOKS, on at their options."""
  workdir = tmp_path / 'h'
  assert run('train', '--ema-decay', '0.999', '--histograms', '100', '--steps', '200',
             '--workdir', str(workdir), '--no-progress') == 0
  records = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  ema = [r for r in records if 'eval_ema/accuracy' in r]
  params = [r for r in records if 'eval/accuracy' in r]
  assert [r['step'] for r in ema] == [r['step'] for r in params] == [200]
  assert params[0]['eval/accuracy'] == pytest.approx(0.9722, abs=1e-3)
  assert abs(ema[0]['eval_ema/accuracy'] - params[0]['eval/accuracy']) <= 0.01
  assert [r['step'] for r in records if 'grad_norm/Dense_0' in r] == [100, 200]


def test_mnist1d_cnn_runs(tmp_path):
  assert run('train', '--dataset', 'mnist1d', '--model', 'cnn', '--steps', '30',
             '--eval-every', '0', '--workdir', str(tmp_path / 'm'), '--no-progress') == 0
  assert (tmp_path / 'm' / 'final_metrics.json').exists()


def write_npz(path, **overrides):
  rng = np.random.default_rng(0)
  arrays = {'x_train': rng.normal(size=(32, 64)).astype(np.float32),
            'y_train': rng.integers(0, 4, 32), 'x_test': rng.normal(size=(8, 64)),
            'y_test': rng.integers(0, 4, 8)}
  arrays.update(overrides)
  np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
  return f'npz:{path}'


def test_npz_data_with_mlp(tmp_path):
  data = write_npz(tmp_path / 'd.npz')
  assert run('train', '--dataset', data, '--model', 'mlp', '--steps', '5', '--batch-size', '8',
             '--workdir', str(tmp_path / 'r'), '--no-progress') == 0


@pytest.mark.parametrize('args, message', [
    (['--dataset', 'cifar10'], "dataset: expected one of ['digits', 'mnist1d', 'pystdlib'] or ['npz:PATH', 'text:PATH'] or MODULE:FUNCTION (your own, e.g. mypkg.data:load), got 'cifar10'"),
    (['--batch-size', '5000'], 'batch_size: expected in [1, 1437] (training examples), got 5000'),
    (['--steps', '0'], 'steps: expected >= 1 and < 2**31, got 0'),
    (['--learning-rate', '-1'], 'learning_rate: expected a finite value in (0, 10], got -1.0'),
    (['NPZ', 'missing_key'], "key 'y_test': expected present"),
    (['NPZ', 'float_labels'], 'y_train.dtype: expected an integer dtype (class labels), got float32'),
    (['NPZ', 'label_range'], 'y_train: expected labels in [0, 3), got labels in [0, 9]'),
    (['NPZ', 'image_shape'], 'x_train.shape: expected [batch, length, channels] or [batch, height, width, channels] for CNN'),
])
def test_bad_input_is_a_clear_error_and_leaves_no_run_directory(tmp_path, capsys, args, message):
  if args[0] == 'NPZ':
    kind = args[1]
    overrides = {
        'missing_key': dict(y_test=None),
        'float_labels': dict(y_train=np.zeros(32, np.float32)),
        'label_range': dict(y_train=np.arange(32) % 10, num_classes=np.int64(3)),
        'image_shape': {},
    }[kind]
    args = ['--dataset', write_npz(tmp_path / 'd.npz', **overrides), '--batch-size', '8']
    if kind != 'image_shape':
      args += ['--model', 'mlp']
  workdir = tmp_path / 'never'
  assert run('train', '--workdir', str(workdir), '--no-progress', *args) == 2
  err = capsys.readouterr().err
  assert message in err, err
  assert not workdir.exists()
  assert 'run directory' not in err     # issue 13.9: not for a directory never created


def test_unknown_model_is_rejected_by_the_parser(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    run('train', '--model', 'vit', '--workdir', str(tmp_path / 'x'))
  assert e.value.code == 2
  assert 'vit' in capsys.readouterr().err
  assert not (tmp_path / 'x').exists()


def test_existing_workdir_is_not_overwritten(tmp_path, capsys):
  (tmp_path / 'keep.txt').write_text('precious')
  assert run('train', '--workdir', str(tmp_path), '--steps', '1', '--no-progress') == 2
  assert 'workdir: expected a new or empty directory, or a purax run directory to resume' in capsys.readouterr().err
  assert (tmp_path / 'keep.txt').read_text() == 'precious'
  # A file named as the workdir is refused the same way, and kept.
  assert run('train', '--workdir', str(tmp_path / 'keep.txt'), '--steps', '1',
             '--no-progress') == 2
  assert "expected a directory (new, empty, or a purax run to resume), got '" in \
      capsys.readouterr().err
  assert (tmp_path / 'keep.txt').read_text() == 'precious'


def test_a_run_failing_in_an_empty_workdir_leaves_it_empty(tmp_path, capsys):
  # It fails after writing config.json and logs (diverged: non-finite steps),
  # before any checkpoint: the directory is left as it was found.
  workdir = tmp_path / 'empty'
  workdir.mkdir()
  # Finite inputs near float32's limit: the logits overflow, every gradient is
  # non-finite (an absurd --learning-rate is refused before anything starts).
  data = write_npz(tmp_path / 'huge.npz', x_train=np.full((32, 64), 3e38, np.float32))
  assert run('train', '--model', 'mlp', '--dataset', data, '--batch-size', '8', '--steps', '40',
             '--log-every', '5', '--max-consecutive-skips', '2', '--workdir', str(workdir),
             '--no-progress') == 2
  assert 'consecutive steps with non-finite gradients' in capsys.readouterr().err
  assert workdir.is_dir() and list(workdir.iterdir()) == []


def test_eval_of_a_non_run_directory(tmp_path, capsys):
  assert run('eval', '--workdir', str(tmp_path)) == 2
  assert 'workdir: expected a run directory with config.json' in capsys.readouterr().err


def test_precision_accumulation_and_remat_options(tmp_path, capsys):
  assert run('train', '--model', 'resnet', '--precision', 'bf16', '--microbatches', '2',
             '--remat', 'dots_saveable', '--steps', '4', '--eval-every', '0',
             '--workdir', str(tmp_path / 'r'), '--no-progress') == 0
  config = TrainConfig.from_json((tmp_path / 'r' / 'config.json').read_text()).flat()
  assert (config['precision'], config['microbatches'], config['remat']) == ('bf16', 2, 'dots_saveable')
  # float16: the scale applied is the state's (2**15) on the mean loss, not
  # scale x batch weight, so a healthy run skips no step at its start.
  assert run('train', '--precision', 'fp16', '--steps', '12', '--eval-every', '0',
             '--log-every', '4', '--workdir', str(tmp_path / 'h'), '--no-progress') == 0
  rows = [json.loads(l) for l in (tmp_path / 'h' / 'metrics.jsonl').read_text().splitlines()]
  assert sum(r.get('train/skipped', 0) for r in rows) == 0, rows
  assert json.loads((tmp_path / 'h' / 'final_metrics.json').read_text())['step'] == 12
  for args, message in [
      (['--precision', 'fp4'], "precision: expected one of ['bf16', 'fp16', 'fp32', 'fp8', 'auto']"),
      (['--precision', 'fp8'], 'precision: expected a policy without float8 matmuls for --model cnn'),
      (['--microbatches', '3'], 'batch_size: expected a multiple of microbatches=3, got 64'),
      (['--remat', 'full'], "remat: expected unset for --model cnn (its options: dropout_rate)"),
      (['--remat', 'some'], "remat: expected one of"),
  ]:
    assert run('train', '--workdir', str(tmp_path / 'x'), '--no-progress', *args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / 'x').exists()


def test_export_and_generate_need_no_data_file_and_eval_names_it(tmp_path, capsys):
  """Issue 13.8: export and generate rebuild the model from the shapes the
  checkpoint records; eval needs the test split, so it names the missing file."""
  data = write_npz(tmp_path / 'd.npz')
  text = tmp_path / 'notes.txt'
  text.write_text('def f(x):\n  return x + 1\n' * 200)
  cls, lm = str(tmp_path / 'cls'), str(tmp_path / 'lm')
  assert run('train', '--dataset', data, '--model', 'mlp', '--steps', '3', '--batch-size', '8',
             '--eval-every', '0', '--workdir', cls, '--no-progress') == 0
  assert run('train', '--model', 'lm', '--dataset', f'text:{text}', '--steps', '2',
             '--batch-size', '4', '--seq-len', '16', '--d-model', '16', '--num-layers', '1',
             '--num-heads', '2', '--eval-every', '0', '--workdir', lm, '--no-progress') == 0
  os.remove(data[4:])
  text.unlink()
  capsys.readouterr()
  assert run('export', '--workdir', cls) == 0
  exported = json.loads(capsys.readouterr().out.strip().splitlines()[-1])['exported']
  assert os.path.isfile(exported)
  from purax.io.export import load_predict     # issue 29.5: [n, 64] data, not digits' shape
  predict = load_predict(os.path.join(cls, 'export'))
  x = np.zeros((5, *predict.input_shape), predict.dtype)
  assert predict.input_shape == (64,) and predict(x).shape == (5, 4)
  assert run('generate', '--workdir', lm, '--prompt', 'def ', '--max-new-tokens', '4') == 0
  assert capsys.readouterr().out.startswith('def ')
  assert run('eval', '--workdir', cls) == 2
  assert "dataset: expected an existing .npz file, got '" in capsys.readouterr().err
  assert run('eval', '--workdir', cls, '--batch-size', '0') == 2
  assert 'batch_size: expected >= 1 or unset, got 0' in capsys.readouterr().err
  assert run('generate', '--workdir', lm, '--prompt', 'x', '--max-new-tokens', str(2 ** 40)) == 2
  assert 'max_new_tokens: expected in [1, 65536], got 1099511627776' in capsys.readouterr().err


def test_a_language_model_batch_that_cannot_fit_is_refused_with_the_estimate(tmp_path, capsys):
  """Issue 13.7: estimated before compiling (no 86 s OOM traceback), nothing written."""
  workdir = tmp_path / 'lm'
  assert run('train', '--model', 'lm', '--dataset', 'pystdlib', '--batch-size', '60000',
             '--seq-len', '512', '--workdir', str(workdir), '--no-progress') == 2
  err = capsys.readouterr().err
  assert re.search(r'batch_size: expected a step that fits in the [\d.]+ GiB available .*'
                   r'got 60000, needing [\d.]+ GiB \(activations and state', err), err
  assert not workdir.exists()


def test_steps_per_call_trains_the_same_run(tmp_path):
  common = ['--model', 'mlp', '--steps', '40', '--log-every', '10', '--eval-every', '20',
            '--checkpoint-every', '20', '--no-progress']
  assert run('train', *common, '--workdir', str(tmp_path / 'one')) == 0
  assert run('train', *common, '--steps-per-call', '10', '--workdir', str(tmp_path / 'ten')) == 0
  final = lambda name: json.loads((tmp_path / name / 'final_metrics.json').read_text())  # noqa: E731
  assert final('one') == final('ten')
  assert run('train', *common[:-1], '--steps-per-call', '3', '--workdir',
             str(tmp_path / 'bad')) == 2


@pytest.mark.parametrize('command, typo, suggested', [
    ('train', ['--learning-rat', '1e-3'], '--learning-rate FLOAT'),
    ('sweep', ['--learning-rat', '1e-3'], '--learning-rate STR'),
    ('eval', ['--workdir', 'w', '--batch-sise', '3'], '--batch-size'),
])
def test_a_mistyped_option_suggests_the_options_of_its_own_subcommand(command, typo, suggested,
                                                                      capsys):
  """Issue 29.5: `purax train --learning-rat` suggests train's option, not
  sweep's (`... in purax sweep --help`)."""
  with pytest.raises(SystemExit) as e:
    cli.main([command, *typo])
  assert e.value.code == 2
  err = re.sub(r'[│╭╰─╮╯]', ' ', capsys.readouterr().err)
  assert suggested in err and f'purax {command} --help' in err
  others = set(cli.SUBCOMMANDS) - {command}
  assert not [o for o in others if f'purax {o}' in err], err


#: What ``--help`` and an option error must not import (seconds before the
#: parser answers): jax and what builds on it, and numpy, which it needs no more.
HEAVY = ('jax', 'jaxlib', 'flax', 'optax', 'orbax', 'chex', 'grain', 'numpy')

#: (argv, exit status, a line it prints): every subcommand's --help (0), and
#: errors the parser itself finds (2): an unknown option, a bad choice of each
#: table (models, optimizers, weight-decay masks, rules, strategies, export
#: formats), a bad number; on a run directory (RUN) too.
PARSED_ONLY = [
    (['--help'], 0, 'usage: purax [-h]'), (['tune', 'lr', '--help'], 0, 'usage: purax tune lr'),
    *[([name, '--help'], 0, f'usage: purax {name}') for name in cli.SUBCOMMANDS],
    (['train', '--learning-rat', '1e-3'], 2, 'Unrecognized options: --learning-rat'),
    (['train', '--model', 'nope'], 2, "model: expected one of ('mlp', 'cnn', 'resnet'"),
    (['train', '--model', 'mypkg.nets.make_net'], 2, "(did you mean 'mypkg.nets:make_net'?)"),
    (['train', '--optimizer', 'nope'], 2, "Expected one of ('adamw', 'sgd'"),
    (['train', '--steps', 'many'], 2, 'Error parsing --steps'),
    (['sweep', '--weight-decay-mask', 'nope'], 2, "Expected one of ('matrices', 'all')"),
    (['tune', 'lr', '--rule', 'nope'], 2,
     "Expected one of ('lowest', 'largest_within', 'steepest', 'minimum')"),
    (['tune', 'lr', '--strategy', 'nope'], 2, "Expected one of ('auto', 'vmap'"),
    (['tune', 'lr', '--bogus'], 2, 'run purax tune lr --help'),
    (['export', '--workdir', 'w', '--format', 'zip'], 2, "Expected one of ('jax', 'onnx'"),
    (['nope'], 2, 'Unrecognized options: nope'),
    (['train', '--workdir', 'RUN', '--help'], 0, 'usage: purax train'),
    (['train', '--workdir', 'RUN', '--stepz', '3'], 2, 'Unrecognized options: --stepz'),
]

PARSED_ONLY_SCRIPT = """
import contextlib, io, json, sys
from purax.app import cli
out = []
for argv, _, _ in json.loads(sys.argv[1]):
  text = io.StringIO()
  with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
    try:
      status = cli.main(argv)
    except SystemExit as e:
      status = e.code
  out.append([status, text.getvalue()])
print(json.dumps({'results': out, 'imported': [m for m in json.loads(sys.argv[2])
                                               if m in sys.modules]}))
"""


def test_help_and_option_errors_import_no_jax(tmp_path):
  """Issue 29.8: `purax --help`, each subcommand's --help and the errors the
  parser finds answer before jax (or flax, optax, orbax, numpy) is imported:
  a fresh process, then sys.modules. Also on a run directory, whose saved
  config is the parser's defaults."""
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  (run_dir / 'config.json').write_text(TrainConfig.of(model='mlp', steps=7).saved_form().to_json())
  cases = [([str(run_dir) if a == 'RUN' else a for a in argv], status, line)
           for argv, status, line in PARSED_ONLY]
  env = {k: v for k, v in os.environ.items() if not k.startswith('PURAX_')}
  out = subprocess.run([sys.executable, '-c', PARSED_ONLY_SCRIPT, json.dumps(cases),
                        json.dumps(HEAVY)], env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  answer = json.loads(out.stdout.splitlines()[-1])
  assert answer['imported'] == [], answer['imported']
  for (argv, status, line), (got, text) in zip(cases, answer['results']):
    text = re.sub(r'\s+', ' ', re.sub(r'[│╭╰─╮╯]', ' ', text))
    assert got == status and line in text, (argv, text[-2000:])
  # The saved run is what `train --workdir RUN` parses against: its steps are the default.
  assert '(default: 7)' in re.sub(r'\s+', ' ', re.sub(r'[│]', ' ', answer['results'][-2][1]))
