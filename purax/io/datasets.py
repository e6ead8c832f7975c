"""Built-in real data sets and user ``.npz`` files, as in-memory arrays.

- ``digits``: scikit-learn's bundled 1,797 8x8 handwritten digits (UCI
  optdigits test set), pixels scaled to [0, 1], shape ``[n, 8, 8, 1]``;
  a fixed stratified split (seed 0): 1,437 train, 360 test.
- ``mnist1d``: MNIST-1D (Greydanus 2020, arXiv:2011.14439), generated offline
  by the ``mnist1d`` package's own ``make_dataset`` with its published default
  arguments (5,000 examples, seed 42): 4,000 train, 1,000 test, ``[n, 40, 1]``.
- ``npz:PATH`` (or a path ending in ``.npz``): arrays ``x_train``, ``y_train``,
  ``x_test``, ``y_test`` and optionally ``num_classes``.
- ``pystdlib`` and ``text:PATH``: byte-level language-model corpora
  (:mod:`purax.io.text`).
- ``MODULE:FUNCTION`` (``mypkg.data:load``): your own function's arrays
  (:func:`from_function`), a row built on the fly by :func:`lookup`.

:data:`DATASETS` is the one table of data sets: a name (``digits``) or a
prefix (``npz:``) maps to a :class:`Source` (its loader, a line of help,
whether it holds tokens, the loss that fits it). :func:`load` and the command
line's ``--dataset`` both read it, so a new data set is its loader plus one
row.

Nothing here downloads.
"""

from __future__ import annotations

import dataclasses
import math
import os
import zipfile
import zlib
from typing import Callable, Union

import numpy as np

from purax.core import lazy
from purax.core.errors import ConfigError, DataError, expect
from purax.io import text

#: More classes than this is refused (as TrainConfig.num_classes).
MAX_CLASSES = 2 ** 24
NPZ_KEYS = ('x_train', 'y_train', 'x_test', 'y_test')


@dataclasses.dataclass(frozen=True)
class ArrayDataset:
  """A classification data set held in host memory.

  Attributes:
    name: the name it was loaded by.
    x_train: float32 ``[n_train, ...]``; y_train: int32 ``[n_train]``.
    x_test: float32 ``[n_test, ...]`` (same trailing shape); y_test: int32 ``[n_test]``.
    num_classes: labels lie in ``[0, num_classes)``.
  """

  name: str
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.x_train.shape[1:])


def validate(ds: ArrayDataset) -> ArrayDataset:
  """Checks shapes, dtypes and label ranges; returns ``ds`` with float32/int32 arrays.

  Raises:
    DataError: naming the array, the expected and the actual value.
  """
  expect(isinstance(ds.num_classes, (int, np.integer)) and not isinstance(ds.num_classes, bool)
         and 2 <= ds.num_classes <= MAX_CLASSES,
         'num_classes', f'an integer in [2, {MAX_CLASSES}]', repr(ds.num_classes))
  out = {}
  for split in ('train', 'test'):
    x, y = np.asarray(getattr(ds, f'x_{split}')), np.asarray(getattr(ds, f'y_{split}'))
    expect(x.ndim >= 2, f'x_{split}.shape', '[examples, ...features]', x.shape)
    expect(all(d >= 1 for d in x.shape[1:]), f'x_{split}.shape',
           '[examples, ...features] with every feature dimension >= 1', x.shape)
    expect(np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer),
           f'x_{split}.dtype', 'a numeric dtype', x.dtype)
    expect(y.ndim == 1, f'y_{split}.shape', f'[{x.shape[0]}] (one label per example)',
           y.shape)
    expect(np.issubdtype(y.dtype, np.integer), f'y_{split}.dtype',
           'an integer dtype (class labels)', y.dtype)
    expect(len(y) == len(x), f'y_{split}.shape', f'[{len(x)}] (as x_{split})', y.shape)
    expect(len(x) >= 1, f'x_{split}.shape', 'at least one example', x.shape)
    lo, hi = int(y.min()), int(y.max())
    expect(lo >= 0 and hi < ds.num_classes, f'y_{split}',
           f'labels in [0, {ds.num_classes})', f'labels in [{lo}, {hi}]')
    x = x.astype(np.float32)
    expect(bool(np.isfinite(x).all()), f'x_{split}', 'finite values', 'NaN or inf')
    out[f'x_{split}'], out[f'y_{split}'] = x, y.astype(np.int32)
  expect(out['x_test'].shape[1:] == out['x_train'].shape[1:], 'x_test.shape',
         f'[n, {", ".join(map(str, out["x_train"].shape[1:]))}] (as x_train)',
         out['x_test'].shape)
  return dataclasses.replace(ds, **out, num_classes=int(ds.num_classes))


#: The example indices of ``digits``' train and test sets, in order (int16
#: ``[1437]`` and ``[360]``): the split ``sklearn.model_selection.train_test_split(
#: x, y, test_size=0.2, random_state=0, stratify=y)`` draws, stored so that
#: loading digits imports no scikit-learn (its import is most of a short
#: run's start-up) and the split stays the same whatever its version.
#: tests/io/test_datasets.py checks it against the installed scikit-learn.
DIGITS_SPLIT = os.path.join(os.path.dirname(__file__), 'digits_split.npz')


def digits() -> ArrayDataset:
  """scikit-learn's bundled digits, ``[n, 8, 8, 1]`` in [0, 1]; fixed split
  (:data:`DIGITS_SPLIT`). Read from scikit-learn's own data file
  (``sklearn/datasets/data/digits.csv.gz``, what ``load_digits`` reads)
  without importing scikit-learn; through ``load_digits`` where an
  installed version keeps it elsewhere."""
  images, target = _bundled_digits()
  x = (images / 16.0).astype(np.float32)[..., None]
  y = target.astype(np.int32)
  with np.load(DIGITS_SPLIT) as split:
    train, test = split['train'], split['test']
  return ArrayDataset('digits', x[train], y[train], x[test], y[test], 10)


def _bundled_digits() -> tuple[np.ndarray, np.ndarray]:
  """``(images [1797, 8, 8] float64, target [1797] int)`` as
  ``sklearn.datasets.load_digits`` returns them."""
  import gzip
  import importlib.util
  spec = importlib.util.find_spec('sklearn')     # locates the package, runs none of it
  path = (os.path.join(spec.submodule_search_locations[0], 'datasets', 'data', 'digits.csv.gz')
          if spec is not None and spec.submodule_search_locations else None)
  if path is None or not os.path.isfile(path):
    from sklearn.datasets import load_digits
    data = load_digits()
    return data.images, data.target
  with gzip.open(path, 'rt', encoding='utf-8') as f:
    data = np.loadtxt(f, delimiter=',')
  return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def mnist1d() -> ArrayDataset:
  """MNIST-1D from the package's own generator, default arguments, ``[n, 40, 1]``."""
  from mnist1d.data import get_dataset_args, make_dataset
  np_state = np.random.get_state()   # make_dataset seeds numpy's global RNG
  try:
    data = make_dataset(get_dataset_args())
  finally:
    np.random.set_state(np_state)
  return ArrayDataset('mnist1d', data['x'].astype(np.float32)[..., None],
                      data['y'].astype(np.int32),
                      data['x_test'].astype(np.float32)[..., None],
                      data['y_test'].astype(np.int32), 10)


def from_npz(path: str, num_classes: int | None = None) -> ArrayDataset:
  """Loads ``x_train, y_train, x_test, y_test`` (and optional ``num_classes``).

  Without ``num_classes`` in the file or the argument it is the largest
  training label + 1 (a test label beyond it is refused).

  Raises:
    DataError: the file is missing, is not an .npz archive, or lacks a key (the
      message lists those present).
  """
  expect(os.path.isfile(path), 'dataset', 'an existing .npz file', repr(path))
  try:
    # mmap: a single .npy (refused below) is mapped, never allocated from its header
    archive = np.load(path, allow_pickle=False, mmap_mode='r')
  except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:   # not a numpy file
    raise DataError(f'dataset: expected an .npz archive (numpy.savez), got {path!r} '
                    f'({type(e).__name__}: {e})') from None
  expect(isinstance(archive, np.lib.npyio.NpzFile), 'dataset',
         'an .npz archive (numpy.savez) of x_train, y_train, x_test, y_test',
         f'{path!r}, a single .npy array')
  with archive as f:
    present = sorted(f.files)
    for key in NPZ_KEYS:
      expect(key in f.files, f'{path}: key {key!r}', 'present',
             f'keys {present}')
    arrays = {key: _read(f, key, path) for key in NPZ_KEYS}
    if num_classes is None and 'num_classes' in f.files:
      value = _read(f, 'num_classes', path)
      expect(value.shape == () and np.issubdtype(value.dtype, np.integer),
             f'{path}: num_classes', 'an integer scalar',
             f'{value.dtype}{list(value.shape)} {value.ravel()[:3].tolist()}')
      num_classes = int(value)
  if num_classes is None:
    # From the training labels only, so that a test label no training example
    # has is refused by validate() (naming y_test), not taken as one more class.
    y = arrays['y_train']
    num_classes = max(2, int(y.max()) + 1) if np.issubdtype(y.dtype, np.integer) and y.size \
        else 2
  return ArrayDataset(f'npz:{path}', num_classes=num_classes, **arrays)


def _read(archive, key: str, path: str) -> np.ndarray:
  """One array of an .npz archive; unreadable members are a DataError naming the
  key, and a header whose shape needs more bytes than the member holds is
  refused before anything is allocated."""
  try:
    name = key if key in archive.zip.namelist() else f'{key}.npy'
    with archive.zip.open(name) as member:
      version = np.lib.format.read_magic(member)
      if version in ((1, 0), (2, 0)):
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(member)
        needed = math.prod(shape) * dtype.itemsize
        held = archive.zip.getinfo(name).file_size - member.tell()
        expect(needed <= held, f'{path}: key {key!r}',
               f'{needed} bytes of data for its header ({dtype}{list(shape)})',
               f'{held} (a truncated member or a forged header)')
    return archive[key]
  except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
    # object arrays (refused: no pickles), truncated or corrupt members
    raise DataError(f'{path}: key {key!r}: expected a numeric array, got one that cannot be '
                    f'read ({type(e).__name__}: {e})') from None


def user_function(path: str) -> Callable:
  """The function ``path`` (``module.path:function``) names, imported
  (:func:`purax.core.lazy.user`).

  Raises:
    ConfigError: the module does not import, lacks the name, or it is no function.
  """
  fn = lazy.user(path, 'dataset')
  expect(callable(fn), 'dataset', f'{path} to be a function () -> (x_train, y_train, x_test, '
         'y_test)', type(fn).__name__, ConfigError)
  return fn


def from_function(path: str, num_classes: int | None = None) -> ArrayDataset:
  """The data set your function ``path`` (``'mypkg.data:load'``) returns.

  The function is called with no argument and returns the four arrays
  ``(x_train, y_train, x_test, y_test)`` (a tuple, or a dict of those keys
  and optionally ``num_classes``) or an :class:`ArrayDataset`: inputs
  ``[n, ...features]``, integer labels ``[n]``. Without ``num_classes`` the
  classes are the largest training label + 1, as for an ``.npz`` file;
  :func:`validate` checks the rest (naming the array).

  Raises:
    ConfigError: as :func:`user_function`. DataError: a result of another kind (named).
  """
  out = user_function(path)()
  if isinstance(out, dict) and all(k in out for k in NPZ_KEYS):
    num_classes = out.get('num_classes') if num_classes is None else num_classes
    arrays = [out[k] for k in NPZ_KEYS]
  elif isinstance(out, (tuple, list)) and len(out) == 4:
    arrays = list(out)
  elif isinstance(out, ArrayDataset):
    arrays = [out.x_train, out.y_train, out.x_test, out.y_test]
    num_classes = out.num_classes if num_classes is None else num_classes
  else:
    raise DataError(f'dataset: expected {path}() to return (x_train, y_train, x_test, y_test), '
                    f'a dict of those keys or a purax.io.datasets.ArrayDataset, got '
                    f'{type(out).__name__}' + (f' of length {len(out)}'
                                               if isinstance(out, (tuple, list)) else ''))
  arrays = [np.asarray(a) for a in arrays]
  if num_classes is None:
    y = arrays[1]
    num_classes = max(2, int(y.max()) + 1) if np.issubdtype(y.dtype, np.integer) and y.size \
        else 2
  return ArrayDataset(path, *arrays, num_classes=num_classes)


Dataset = Union[ArrayDataset, text.TextDataset]


@dataclasses.dataclass(frozen=True)
class Source:
  """A row of :data:`DATASETS`.

  Attributes:
    load: ``(argument, *, num_classes, seq_len, max_eval_windows) -> Dataset``;
      ``argument`` is what follows a prefix key (``npz:PATH`` gives ``PATH``),
      else the name itself. A loader ignores the options it has no use for.
    help: one line for ``--help`` and the README.
    tokens: a byte corpus for language models (``seq_len`` applies,
      ``num_classes`` is the vocabulary and cannot be set).
    loss: the key in :data:`purax.core.objectives.BUILTIN` of the loss that fits it.
    user: the row of a user's ``MODULE:FUNCTION`` (:func:`from_function`).
  """

  load: Callable[..., Dataset]
  help: str
  tokens: bool = False
  loss: str = 'classification'
  user: bool = False


def _builtin(make: Callable[[], ArrayDataset]) -> Callable[..., ArrayDataset]:
  def load(name, *, num_classes=None, **unused):
    ds = make()
    return ds if num_classes is None else dataclasses.replace(ds, num_classes=num_classes)
  return load


def _corpus(read: Callable[..., tuple[np.ndarray, np.ndarray]], prefix: str = ''):
  def load(argument, *, seq_len, max_eval_windows=256, **unused):
    train, valid = read(argument, seq_len) if prefix else read()
    return text.windows(prefix + argument, train, valid, seq_len=seq_len,
                        max_eval_windows=max_eval_windows)
  return load


#: The one table of data sets: name -> :class:`Source` (loader, loss, help);
#: ``--dataset`` and :func:`load` read it.
DATASETS: dict[str, Source] = {
    'digits': Source(_builtin(digits),
                     "scikit-learn's 8x8 handwritten digits, [8, 8, 1], 10 classes"),
    'mnist1d': Source(_builtin(mnist1d),
                      'MNIST-1D (Greydanus 2020), generated offline, [40, 1], 10 classes'),
    'npz:': Source(lambda path, *, num_classes=None, **unused: from_npz(path, num_classes),
                   'npz:PATH: arrays x_train, y_train, x_test, y_test (+ num_classes)'),
    'pystdlib': Source(_corpus(text.pystdlib),
                       "the Python standard library's sources, as bytes", tokens=True,
                       loss='language_model'),
    'text:': Source(_corpus(text.from_file, 'text:'), 'text:PATH: any UTF-8 file, as bytes',
                    tokens=True, loss='language_model'),
}


#: The row of a user's ``MODULE:FUNCTION``, which :func:`lookup` gives.
USER = Source(lambda path, *, num_classes=None, **unused: from_function(path, num_classes),
              'MODULE:FUNCTION: your own function () -> (x_train, y_train, x_test, y_test)',
              user=True)


def lookup(name: str) -> tuple[Source, str, str | None]:
  """The row of ``name``: an exact key, else its prefix (``npz:``, ``text:``),
  else ``npz:`` for a path ending in ``.npz``, else :data:`USER` for an
  import path ``module.path:function`` (a module named ``npz`` or ``text``
  is read as those prefixes).

  Returns:
    ``(source, argument, path)``: the row, what its loader is given, and the
    file the name points at (None for a built-in data set).

  Raises:
    ConfigError: no row fits, naming the known ones.
  """
  if name in DATASETS:
    return DATASETS[name], name, None
  for key, source in DATASETS.items():
    if key.endswith(':') and name.startswith(key) and len(name) > len(key):
      return source, name[len(key):], name[len(key):]
  if name.endswith('.npz'):
    return DATASETS['npz:'], name, name
  if lazy.is_import_path(name):
    return USER, name, None
  raise ConfigError(f"dataset: expected one of {[k for k in DATASETS if not k.endswith(':')]} "
                    f"or {[k + 'PATH' for k in DATASETS if k.endswith(':')]} or MODULE:FUNCTION "
                    f"(your own, e.g. mypkg.data:load), got {name!r}{lazy.path_hint(name)}")


def load(name: str, *, num_classes: int | None = None, seq_len: int | None = None,
         max_eval_windows: int = 256) -> Dataset:
  """Loads and validates a data set of :data:`DATASETS` by name.

  Args:
    name: ``digits``, ``mnist1d``, ``npz:PATH`` (or ``PATH.npz``), ``pystdlib``
      or ``text:PATH``.
    num_classes: override the classes of an array data set (labels must lie in
      ``[0, num_classes)``); refused for a token corpus (256 bytes).
    seq_len: tokens per example of a token corpus (required there, unused otherwise).
    max_eval_windows: validation windows of a token corpus.

  Returns:
    An :class:`ArrayDataset` (float32 ``x [n, ...]``, int32 ``y [n]``) or a
    :class:`purax.io.text.TextDataset` (windows of ``seq_len`` bytes).

  Raises:
    ConfigError: unknown name, or an option the data set cannot take.
    DataError: malformed arrays or files.
  """
  source, argument, _ = lookup(name)
  if source.tokens:
    expect(num_classes is None, 'num_classes',
           f'unset for the text dataset {name!r} (bytes: {text.VOCAB_SIZE} tokens)',
           num_classes, ConfigError)
    expect(seq_len is not None, 'seq_len', f'a length for the text dataset {name!r}',
           seq_len, ConfigError)
    return source.load(argument, seq_len=seq_len, max_eval_windows=max_eval_windows)
  return validate(source.load(argument, num_classes=num_classes))
