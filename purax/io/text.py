"""Byte-level language-model data from UTF-8 text, available offline.

- ``pystdlib``: the Python standard library's own ``.py`` sources (the
  interpreter running purax: ``sysconfig.get_paths()['stdlib']``, without
  ``site-packages``), files in sorted path order, files that are not valid
  UTF-8 skipped; every 20th file (sorted positions 19, 39, ...) is the
  validation split, the rest is the training split (about 30 MB / 1.5 MB for
  CPython 3.11). Splitting by file keeps near-copies of a window out of the
  validation split. The corpus depends on the Python version.
- ``text:PATH``: any UTF-8 file; the last 10% of its bytes (at least
  ``seq_len + 1``) are the validation split.

Tokens are bytes (vocabulary 256), so the model's loss in bits per token is
bits per byte. A training batch is ``batch_size`` windows of ``seq_len + 1``
bytes at offsets drawn from ``numpy.random.default_rng([seed, step])``: random
access by step, as :mod:`purax.io.pipeline`, so resume is exact and nothing is
materialised beyond the corpus. Validation uses up to ``max_eval_windows``
fixed windows evenly spread over the validation split.

Nothing here downloads.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sysconfig
from typing import TYPE_CHECKING

import numpy as np

from purax.core.errors import ConfigError, DataError, expect
from purax.io import pipeline

# grain is imported on use: the core and the models need only jax, flax and optax
# (so benchmarks/lm.py runs on a GPU image without grain).
if TYPE_CHECKING:
  import grain

VOCAB_SIZE = 256
SKIP_DIRS = frozenset({'site-packages', 'dist-packages', '__pycache__'})


@dataclasses.dataclass(frozen=True)
class TextDataset:
  """A byte corpus split into training and validation bytes.

  Attributes:
    name: the name it was loaded by.
    train: uint8 ``[n_train]`` training bytes; valid: uint8 ``[n_valid]``.
    seq_len: tokens per example (windows hold ``seq_len + 1`` bytes).
    max_eval_windows: validation windows used by ``x_test`` / ``y_test``.
  """

  name: str
  train: np.ndarray
  valid: np.ndarray
  seq_len: int
  max_eval_windows: int = 256

  num_classes = VOCAB_SIZE   # the vocabulary, in the role of the classes

  @property
  def input_shape(self) -> tuple[int, ...]:
    return (self.seq_len,)

  @property
  def x_train(self) -> np.ndarray:
    """Every training window's inputs, uint8 ``[n_train - seq_len, seq_len]``
    (a zero-copy view)."""
    return np.lib.stride_tricks.sliding_window_view(self.train[:-1], self.seq_len)

  @property
  def y_train(self) -> np.ndarray:
    """Every training window's next bytes, as ``x_train`` shifted by one."""
    return np.lib.stride_tricks.sliding_window_view(self.train[1:], self.seq_len)

  @functools.cached_property
  def _eval_windows(self) -> np.ndarray:
    count = (len(self.valid) - 1) // self.seq_len
    starts = np.unique(np.linspace(0, count - 1, min(count, self.max_eval_windows))
                       .round().astype(np.int64)) * self.seq_len
    return self.valid[starts[:, None] + np.arange(self.seq_len + 1)[None]].astype(np.int32)

  @property
  def x_test(self) -> np.ndarray:
    """Validation inputs, int32 ``[windows, seq_len]``."""
    return self._eval_windows[:, :-1]

  @property
  def y_test(self) -> np.ndarray:
    """Validation next bytes, int32 ``[windows, seq_len]``."""
    return self._eval_windows[:, 1:]


def _utf8(data: bytes, where: str) -> None:
  try:
    data.decode('utf-8')
  except UnicodeDecodeError as e:
    raise DataError(f'{where}: expected UTF-8 text, got byte 0x{data[e.start]:02x} '
                    f'at offset {e.start} ({e.reason})') from None


def pystdlib_files(root: str | None = None) -> list[str]:
  """The standard library's ``.py`` files under ``root``, sorted by relative path."""
  root = root or sysconfig.get_paths()['stdlib']
  found = []
  for directory, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
    found += [os.path.join(directory, f) for f in files if f.endswith('.py')]
  return sorted(found, key=lambda p: os.path.relpath(p, root))


@functools.lru_cache(maxsize=1)
def pystdlib(root: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  """``(train, valid)`` uint8 bytes of the standard-library corpus (module doc)."""
  parts = ([], [])
  for i, path in enumerate(pystdlib_files(root)):
    with open(path, 'rb') as f:
      data = f.read()
    try:
      data.decode('utf-8')
    except UnicodeDecodeError:
      continue   # a handful of test files in legacy encodings
    parts[i % 20 == 19].append(data)
  train, valid = (np.frombuffer(b''.join(p), np.uint8) for p in parts)
  expect(len(train) > 0 and len(valid) > 0, 'dataset pystdlib',
         f'Python sources under {root or sysconfig.get_paths()["stdlib"]}', 'none found')
  return train, valid


def from_file(path: str, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
  """``(train, valid)`` bytes of a UTF-8 file: the last 10% (>= seq_len + 1) validate.

  Raises:
    DataError: the file is missing, not UTF-8, or too short for two splits.
  """
  expect(os.path.isfile(path), 'dataset', 'text:PATH naming an existing UTF-8 file',
         repr(f'text:{path}'))
  with open(path, 'rb') as f:
    data = f.read()
  _utf8(data, f'dataset text:{path}')
  n = len(data)
  expect(n > 0, f'dataset text:{path}', 'a non-empty UTF-8 file', 'an empty file')
  n_valid = max(n // 10, seq_len + 1)
  expect(n - n_valid >= seq_len + 1, 'seq_len',
         f'at most {max(n // 2 - 1, 0)} for {path} ({n} bytes: both splits need '
         'seq_len + 1 bytes)', seq_len, ConfigError)
  array = np.frombuffer(data, np.uint8)
  return array[:n - n_valid], array[n - n_valid:]


def windows(name: str, train: np.ndarray, valid: np.ndarray, *, seq_len: int,
            max_eval_windows: int = 256) -> TextDataset:
  """The corpus ``(train, valid)`` (uint8 bytes) as windows of ``seq_len`` tokens;
  loaded by name through :func:`purax.io.datasets.load` (``pystdlib``, ``text:PATH``).

  Raises:
    ConfigError: ``seq_len < 1`` or longer than a split allows.
  """
  expect(seq_len >= 1, 'seq_len', '>= 1', seq_len, ConfigError)
  expect(max_eval_windows >= 1, 'max_eval_windows', '>= 1', max_eval_windows, ConfigError)
  for split, data in (('training', train), ('validation', valid)):
    expect(len(data) >= seq_len + 1, 'seq_len',
           f'<= {len(data) - 1} (the {split} split of {name} has {len(data)} bytes)',
           seq_len, ConfigError)
  return TextDataset(name, train, valid, seq_len, max_eval_windows)


def train_dataset(ds: TextDataset, *, batch_size: int, seed: int,
                  num_steps: int) -> grain.MapDataset:
  """``num_steps`` batches of random training windows, random access by step.

  Returns:
    ``ds[s] == {'x': int32 [batch_size, seq_len], 'y': int32 [batch_size,
    seq_len]}`` with ``y`` the bytes following ``x``; the window offsets of
    step ``s`` come from ``numpy.random.default_rng([seed, s])``.

  Raises:
    ConfigError: ``batch_size < 1`` or ``num_steps < 1``.
  """
  expect(batch_size >= 1, 'batch_size', '>= 1', batch_size, ConfigError)
  expect(num_steps >= 1, 'steps', '>= 1', num_steps, ConfigError)
  data, seq_len = ds.train, ds.seq_len
  offsets = np.arange(seq_len + 1)[None]

  def batch_of_step(step: int) -> dict[str, np.ndarray]:
    starts = np.random.default_rng([seed, step]).integers(0, len(data) - seq_len,
                                                          size=batch_size)
    windows = data[starts[:, None] + offsets].astype(np.int32)
    return {'x': windows[:, :-1], 'y': windows[:, 1:]}

  import grain
  return pipeline.fresh(grain.MapDataset.range(num_steps).map(batch_of_step))   # new windows


def encode(text: str) -> np.ndarray:
  """UTF-8 bytes of ``text`` as int32 token ids ``[len]``.

  Lone surrogates from undecodable command-line bytes (Python's
  ``surrogateescape``, e.g. ``--prompt $'\\xff'``) become those raw bytes again.
  """
  return np.frombuffer(text.encode('utf-8', errors='surrogateescape'),
                       np.uint8).astype(np.int32)


def decode(tokens) -> str:
  """Token ids (bytes) to text; invalid UTF-8 sequences become U+FFFD."""
  return bytes(np.asarray(tokens, np.uint8).tolist()).decode('utf-8', errors='replace')
