import numpy as np
import pytest

import purax
from purax.io import datasets


def test_digits_is_the_bundled_data_set_with_a_fixed_split():
  ds = datasets.load('digits')
  assert ds.x_train.shape == (1437, 8, 8, 1) and ds.x_test.shape == (360, 8, 8, 1)
  assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
  assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
  assert set(np.unique(ds.y_test)) == set(range(10))
  np.testing.assert_array_equal(datasets.load('digits').y_test, ds.y_test)


def test_digits_is_scikit_learns_data_and_split_read_without_importing_it(monkeypatch):
  """The stored split and the data file read directly give exactly what
  scikit-learn's load_digits and train_test_split(test_size=0.2,
  random_state=0, stratify=y) give; loading it imports no scikit-learn, and
  without the data file where it is (another layout) load_digits reads it."""
  import subprocess
  import sys
  from sklearn.datasets import load_digits
  from sklearn.model_selection import train_test_split
  data = load_digits()
  x = (data.images / 16.0).astype(np.float32)[..., None]
  y = data.target.astype(np.int32)
  expected = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
  for ds in (datasets.digits(), _digits_without_the_data_file(monkeypatch)):
    for got, want in zip((ds.x_train, ds.x_test, ds.y_train, ds.y_test), expected):
      assert got.dtype == want.dtype
      np.testing.assert_array_equal(got, want)
  done = subprocess.run([sys.executable, '-c', 'import sys; from purax.io import datasets; '
                         "datasets.load('digits'); print(sorted(m for m in sys.modules "
                         "if m.split('.')[0] in ('sklearn', 'scipy')))"],
                        capture_output=True, text=True, check=True)
  assert done.stdout.strip() == '[]', done.stdout


def _digits_without_the_data_file(monkeypatch):
  real = datasets.os.path.isfile
  with monkeypatch.context() as m:
    m.setattr(datasets.os.path, 'isfile', lambda p: not p.endswith('digits.csv.gz') and real(p))
    return datasets.digits()


def test_mnist1d_is_generated_offline_with_default_arguments():
  state = np.random.get_state()
  ds = datasets.load('mnist1d')
  assert ds.x_train.shape == (4000, 40, 1) and ds.x_test.shape == (1000, 40, 1)
  assert np.array_equal(np.random.get_state()[1], state[1])  # global RNG untouched
  assert set(np.unique(ds.y_train)) == set(range(10))


def write_npz(tmp_path, **arrays):
  rng = np.random.default_rng(0)
  base = {'x_train': rng.normal(size=(20, 8, 8, 1)).astype(np.float32),
          'y_train': rng.integers(0, 3, 20), 'x_test': rng.normal(size=(6, 8, 8, 1)),
          'y_test': rng.integers(0, 3, 6)}
  base.update(arrays)
  base = {k: v for k, v in base.items() if v is not None}
  path = tmp_path / 'data.npz'
  np.savez(path, **base)
  return f'npz:{path}'


def test_npz_round_trip(tmp_path):
  ds = datasets.load(write_npz(tmp_path, num_classes=np.int64(4)))
  assert ds.num_classes == 4 and ds.x_test.dtype == np.float32


@pytest.mark.parametrize('arrays, match', [
    (dict(y_test=None), r"key 'y_test': expected present, got keys \['x_test', 'x_train', 'y_train'\]"),
    (dict(y_train=np.zeros(20, np.float32)), r'y_train.dtype: expected an integer dtype'),
    (dict(y_train=np.full(20, 7), num_classes=np.int64(3)),
     r'y_train: expected labels in \[0, 3\), got labels in \[7, 7\]'),
    (dict(y_test=np.full(6, -1)), r'y_test: expected labels in \[0, 3\), got labels in \[-1, -1\]'),
    # A test label no training example has (issue 27.5): not one more class.
    (dict(y_test=np.array([0, 1, 2, 0, 1, 50])),
     r'y_test: expected labels in \[0, 3\), got labels in \[0, 50\]'),
    (dict(y_test=np.array([0, 1, 2, 0, 1, 3])),     # the boundary: 3 classes are 0, 1, 2
     r'y_test: expected labels in \[0, 3\), got labels in \[0, 3\]'),
    (dict(x_test=np.zeros((6, 7, 8, 1))), r'x_test.shape: expected \[n, 8, 8, 1\] \(as x_train\), got \(6, 7, 8, 1\)'),
    (dict(y_train=np.zeros(19, np.int64)), r'y_train.shape: expected \[20\]'),
    # Issue 13.7: each kind the fuzzing found.
    (dict(y_train=np.array([1] * 20, dtype=object)),
     r"key 'y_train': expected a numeric array, got one that cannot be read"),
    (dict(y_train=np.full(20, 2 ** 40)),
     r'num_classes: expected an integer in \[2, 16777216\], got 1099511627777'),
    (dict(x_train=np.zeros((20, 0)), x_test=np.zeros((6, 0))),
     r'x_train.shape: expected \[examples, ...features\] with every feature dimension >= 1'),
    (dict(num_classes=np.float64(2.5)), r'num_classes: expected an integer scalar, got float64'),
    (dict(num_classes=np.arange(3)), r'num_classes: expected an integer scalar, got int64\[3\]'),
    (dict(x_test=np.zeros((0, 8, 8, 1)), y_test=np.zeros(0, np.int64)),
     r'x_test.shape: expected at least one example, got \(0, 8, 8, 1\)'),
])
def test_bad_npz_data_raise_named_errors(tmp_path, arrays, match):
  with pytest.raises(purax.DataError, match=match):
    datasets.load(write_npz(tmp_path, **arrays))


def test_a_truncated_npz_archive_is_named(tmp_path):
  path = write_npz(tmp_path)
  data = open(path[4:], 'rb').read()
  with open(path[4:], 'wb') as f:
    f.write(data[:len(data) // 2])
  with pytest.raises(purax.DataError, match=r'dataset: expected an .npz archive|cannot be read'):
    datasets.load(path)


def test_unknown_and_missing_data_sets():
  with pytest.raises(purax.ConfigError, match=r"dataset: expected one of \['digits', 'mnist1d', 'pystdlib'\] or \['npz:PATH'"):
    datasets.load('cifar10')
  with pytest.raises(purax.DataError, match='an existing .npz file'):
    datasets.load('npz:/nonexistent/file.npz')


def test_a_file_that_is_not_an_npz_archive_is_named(tmp_path):
  (tmp_path / 'notes.npz').write_text('not numpy at all\n')
  with pytest.raises(purax.DataError, match=r"dataset: expected an .npz archive \(numpy.savez\), "
                                            r"got '.*notes.npz' \(ValueError"):
    datasets.load(f'npz:{tmp_path}/notes.npz')
  np.save(tmp_path / 'one.npy', np.zeros(3))
  with pytest.raises(purax.DataError, match=r"got '.*one.npy', a single .npy array"):
    datasets.load(f'npz:{tmp_path}/one.npy')


def test_one_table_serves_arrays_and_token_corpora(tmp_path):
  """``load`` reads DATASETS for every kind; options a kind cannot take are refused by name."""
  assert {'digits', 'mnist1d', 'npz:', 'pystdlib', 'text:'} <= set(datasets.DATASETS)
  path = tmp_path / 'a.txt'
  path.write_text('def f(x):\n  return x\n' * 20)
  corpus = datasets.load(f'text:{path}', seq_len=8)
  assert corpus.num_classes == 256 and corpus.input_shape == (8,)
  assert datasets.lookup(f'text:{path}')[2] == str(path)
  assert datasets.lookup('digits')[2] is None
  with pytest.raises(purax.ConfigError, match=r"num_classes: expected unset for the text dataset"):
    datasets.load(f'text:{path}', seq_len=8, num_classes=3)
  with pytest.raises(purax.ConfigError, match=r"seq_len: expected a length for the text dataset"):
    datasets.load(f'text:{path}')
  assert datasets.load('digits', num_classes=12).num_classes == 12
