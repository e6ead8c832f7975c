"""Byte-level text data: the offline stdlib corpus, text:PATH files, batches by step."""

import os

import numpy as np
import pytest

import purax
from purax.io import datasets, text


def write(path, data: bytes) -> str:
  path.write_bytes(data)
  return f'text:{path}'


def test_pystdlib_corpus_is_deterministic_split_by_file_and_large():
  files = text.pystdlib_files()
  assert files == sorted(files) and files, 'sorted relative paths'
  assert not any('site-packages' in f.split(os.sep) for f in files)
  ds = datasets.load('pystdlib', seq_len=64)
  again = datasets.load('pystdlib', seq_len=64)
  np.testing.assert_array_equal(ds.train, again.train)
  np.testing.assert_array_equal(ds.x_test, again.x_test)
  assert len(ds.train) > 1_000_000 and len(ds.valid) > 50_000
  assert 0.02 < len(ds.valid) / (len(ds.train) + len(ds.valid)) < 0.10
  # The validation split is whole files: the 20th sorted file opens it.
  with open(files[19], 'rb') as f:
    first = f.read()
  assert ds.valid[:len(first)].tobytes() == first
  ds.valid.tobytes().decode('utf-8')   # valid UTF-8 throughout


def test_training_batches_are_random_access_windows_of_the_training_split(tmp_path):
  data = bytes(range(256)) * 8   # every window is identified by its first byte and offset
  ds = datasets.load(write(tmp_path / 'a.txt', ''.join(chr(b % 128) for b in data).encode()),
                 seq_len=10)
  batches = text.train_dataset(ds, batch_size=4, seed=3, num_steps=50)
  assert len(batches) == 50
  b7 = batches[7]
  assert b7['x'].shape == b7['y'].shape == (4, 10) and b7['x'].dtype == np.int32
  np.testing.assert_array_equal(b7['x'][:, 1:], b7['y'][:, :-1])   # y is x shifted by one
  for a, b in zip(batches[7].values(), text.train_dataset(ds, batch_size=4, seed=3,
                                                          num_steps=50)[7].values()):
    np.testing.assert_array_equal(a, b)                             # a function of (seed, step)
  assert not np.array_equal(batches[7]['x'], batches[8]['x'])
  train = ds.train.tobytes()
  for row_x, row_y in zip(b7['x'], b7['y']):
    window = bytes(row_x.tolist()) + bytes(row_y[-1:].tolist())
    assert window in train


def test_text_file_split_and_validation_windows(tmp_path):
  content = ('héllo wörld, ' * 100).encode()
  ds = datasets.load(write(tmp_path / 'u.txt', content), seq_len=16, max_eval_windows=5)
  n = len(content)
  assert len(ds.valid) == n // 10 and len(ds.train) == n - n // 10
  assert ds.x_test.shape == ds.y_test.shape == (5, 16) and ds.x_test.dtype == np.int32
  np.testing.assert_array_equal(ds.x_test[:, 1:], ds.y_test[:, :-1])
  assert ds.num_classes == 256 and ds.input_shape == (16,)
  assert ds.x_train.shape == (len(ds.train) - 16, 16)
  assert text.decode(text.encode('ünïcode ✓')) == 'ünïcode ✓'


@pytest.mark.parametrize('kind, error, message', [
    ('missing', purax.DataError, "dataset: expected text:PATH naming an existing UTF-8 file, got 'text:"),
    ('latin1', purax.DataError, r'expected UTF-8 text, got byte 0xe9 at offset 3'),
    ('empty', purax.DataError, 'expected a non-empty UTF-8 file, got an empty file'),
    ('long', purax.ConfigError, r'seq_len: expected at most 49 for .* \(100 bytes: both splits'),
    ('unknown', purax.ConfigError, r"dataset: expected one of \['digits', 'mnist1d', 'pystdlib'\] or \['npz:PATH', 'text:PATH'\] or MODULE:FUNCTION .*got 'wiki'"),
    ('zero', purax.ConfigError, 'seq_len: expected >= 1, got 0'),
])
def test_bad_text_data_is_reported_with_field_expected_and_actual(tmp_path, kind, error, message):
  name, seq_len = {
      'missing': (f'text:{tmp_path}/nope.txt', 8),
      'latin1': (write(tmp_path / 'l.txt', 'café au lait'.encode('latin-1')), 2),
      'empty': (write(tmp_path / 'e.txt', b''), 2),
      'long': (write(tmp_path / 's.txt', b'x' * 100), 60),
      'unknown': ('wiki', 8),
      'zero': ('pystdlib', 0),
  }[kind]
  with pytest.raises(error, match=message):
    datasets.load(name, seq_len=seq_len)


def test_encode_decode_round_trip_including_raw_command_line_bytes():
  for s in ['def f(x):\n', 'café — 日本語 🙂', '']:
    assert text.decode(text.encode(s)) == s
  # An undecodable byte on the command line arrives as a lone surrogate
  # (surrogateescape) and is encoded as that byte again.
  assert text.encode('\udcffa').tolist() == [0xff, ord('a')]
