"""Language models and the encoder end to end through the command line.

A tiny byte-level LM on the default corpus (pystdlib) learns within a short
run (validation bits per byte falls clearly below the 8 bits of a uniform
byte model), ``purax generate`` prints text, the encoder classifies digits
(rows as tokens), and bad input fails before anything is written.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from purax.app import cli
from purax.app.config import TrainConfig
from purax.io.export import load_predict
from purax.app.runs import restore_run

TINY = ['--d-model', '32', '--num-layers', '2', '--num-heads', '4', '--seq-len', '32',
        '--batch-size', '16', '--learning-rate', '3e-3', '--warmup-steps', '10',
        '--no-progress']


def run(*args):
  return cli.main(list(args))


def records(workdir):
  return [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]


@pytest.mark.slow
def test_default_corpus_lm_learns_and_generates(tmp_path, capsys):
  workdir = tmp_path / 'lm'
  assert run('train', '--model', 'lm', '--dataset', 'pystdlib', '--steps', '60',
             '--eval-every', '30', '--log-every', '30', '--workdir', str(workdir), *TINY) == 0
  rows = records(workdir)
  evals = [r['eval/bits_per_byte'] for r in rows if 'eval/bits_per_byte' in r]
  assert len(evals) == 2 and evals[-1] < evals[0] and evals[-1] < 5.0, evals
  train = [r for r in rows if 'tokens_per_sec' in r]
  assert train and train[-1]['tokens_per_sec'] > 0
  assert 'mfu' not in train[-1]          # a CPU has no peak: no MFU rather than a wrong one
  capsys.readouterr()
  assert run('generate', '--workdir', str(workdir), '--prompt', 'def ',
             '--max-new-tokens', '24', '--temperature', '0') == 0
  out = capsys.readouterr().out
  assert out.startswith('def ') and len(out) > 10
  assert run('generate', '--workdir', str(workdir), '--prompt', '') == 2
  assert 'prompt: expected a non-empty string' in capsys.readouterr().err
  assert run('generate', '--workdir', str(workdir), '--prompt', 'x', '--seed', str(2 ** 64)) == 2
  assert 'seed: expected in [0, 2**32), got 18446744073709551616' in capsys.readouterr().err
  # The exported predict function takes token ids and gives the restored model's logits.
  assert run('export', '--workdir', str(workdir)) == 0
  predict = load_predict(str(workdir / 'export'))
  tokens = np.frombuffer(b'def f(x):\n    return x + 1\n' * 2, np.uint8)[:32][None]
  job, state = restore_run(str(workdir))
  task = job.task
  np.testing.assert_allclose(predict(tokens), task.predict(state, jnp.asarray(tokens, jnp.int32)),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_encoder_classifies_digits_rows_as_tokens(tmp_path):
  workdir = tmp_path / 'enc'
  assert run('train', '--model', 'transformer', '--dataset', 'digits', '--steps', '300',
             '--d-model', '32', '--eval-every', '0', '--learning-rate', '1e-2',
             '--workdir', str(workdir), '--no-progress') == 0
  final = json.loads((workdir / 'final_metrics.json').read_text())
  assert final['accuracy'] > 0.9, final
  # The sizes trained are recorded, including the model's defaults.
  config = TrainConfig.from_json((workdir / 'config.json').read_text()).model
  assert (config.d_model, config.num_layers, config.num_heads) == (32, 2, 4), config


@pytest.mark.parametrize('args, message', [
    (['--model', 'lm', '--dataset', 'digits'],
     "dataset: expected 'pystdlib' or 'text:PATH' (text) with --model lm, and only with it, got 'digits' with --model lm"),
    (['--model', 'cnn', '--dataset', 'pystdlib'],
     "got 'pystdlib' with --model cnn"),
    (['--model', 'lm', '--dataset', 'text:/no/such/file.txt'],
     "dataset: expected text:PATH naming an existing UTF-8 file, got 'text:/no/such/file.txt'"),
    (['--model', 'lm', '--dataset', 'LATIN1'], 'expected UTF-8 text, got byte 0xe9 at offset 3'),
    (['--model', 'lm', '--dataset', 'SHORT', '--seq-len', '64'],
     'seq_len: expected at most 49 for'),
])
def test_bad_language_model_input_fails_before_writing(tmp_path, capsys, args, message):
  (tmp_path / 'l.txt').write_bytes('café au lait'.encode('latin-1'))
  (tmp_path / 's.txt').write_bytes(b'x' * 100)
  args = [a.replace('LATIN1', f'text:{tmp_path}/l.txt').replace('SHORT', f'text:{tmp_path}/s.txt')
          for a in args]
  workdir = tmp_path / 'never'
  assert run('train', '--workdir', str(workdir), '--no-progress', *args) == 2
  assert message in capsys.readouterr().err
  assert not workdir.exists()


def test_generate_needs_a_language_model_run(tmp_path, capsys):
  workdir = tmp_path / 'cnn'
  workdir.mkdir()
  (workdir / 'config.json').write_text(json.dumps({'model': 'cnn'}))
  assert run('generate', '--workdir', str(workdir), '--prompt', 'x') == 2
  assert 'workdir: expected a run of --model lm, got --model cnn' in capsys.readouterr().err
