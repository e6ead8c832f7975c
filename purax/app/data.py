"""The data-set table of the command line, and the ``data`` config section.

A data set is loaded into a :class:`Data`: its per-example shapes, number of
classes, random-access training batches by step and
evaluation batches. :data:`DATASETS` maps a name (``digits``) or a prefix
(``npz:``, ``text:``) to a row: a loader ``(DataConfig) -> Data`` and the loss
that fits the data.

Adding a data set to the CLI is one loader and one row here (or the loader in
``purax/io`` and the row here).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Annotated, Any, Callable

import numpy as np
import tyro

from purax.app.fields import field

from purax.core import objectives
from purax.core.errors import ConfigError, expect
from purax.io import datasets, pipeline, text

INT32_LIMIT = 2 ** 31
#: More classes than this is refused (the output layer alone would not fit).
MAX_CLASSES = 2 ** 24


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The data.

  Attributes:
    name: 'digits', 'mnist1d', or 'npz:PATH' (arrays x_train, y_train, x_test,
      y_test); for --model lm: 'pystdlib' (the Python standard library's
      sources) or 'text:PATH' (any UTF-8 file).
    batch_size: examples per update.
    eval_batch_size: examples per evaluation batch (the last is padded).
    seq_len: tokens (bytes) per example of a text dataset (--model lm).
    num_classes: override the number of classes (npz data without num_classes).
  """

  name: Annotated[str, tyro.conf.arg(name='dataset')] = 'digits'
  batch_size: int = 64
  eval_batch_size: int = field(512, resumable=True)
  seq_len: int = 128
  num_classes: int | None = None

  @property
  def spec(self) -> 'DataSpec':
    return lookup(self.name)

  def validate(self) -> 'DataConfig':
    """Raises ConfigError naming the field, the expected and the actual value."""
    lookup(self.name)
    for name in ('batch_size', 'eval_batch_size', 'seq_len'):
      value = getattr(self, name)
      expect(1 <= value < INT32_LIMIT, name, '>= 1 and < 2**31', value, ConfigError)
    expect(self.num_classes is None or 2 <= self.num_classes <= MAX_CLASSES, 'num_classes',
           f'in [2, {MAX_CLASSES}] or unset', self.num_classes, ConfigError)
    return self

  def with_absolute_path(self) -> 'DataConfig':
    """A data file's path made absolute, so that a saved run's eval, export,
    generate and resume work from any directory."""
    path = self.spec.path(self.name)
    if path is None:
      return self
    prefix = self.name[:len(self.name) - len(path)]
    return dataclasses.replace(self, name=prefix + os.path.abspath(path))


@dataclasses.dataclass(frozen=True)
class Data:
  """A loaded data set, as the runs use it.

  Attributes:
    source: the arrays (:class:`purax.io.datasets.ArrayDataset` or
      :class:`purax.io.text.TextDataset`): ``name``, ``x_train``, ``y_train``
      (random access), ``x_test``, ``y_test``, ``num_classes`` (labels or
      tokens lie in ``[0, num_classes)``) and ``input_shape``.
    train_batches: ``(batch_size, seed, num_steps) -> batches[step]``.
  """

  source: Any
  train_batches: Callable

  def __getattr__(self, name):   # name, x_train, ..., num_classes, input_shape: the source's
    if name in ('source', 'train_batches'):
      raise AttributeError(name)
    return getattr(self.source, name)

  def sample(self, batch_size: int) -> dict[str, np.ndarray]:
    """A zero batch of the data's shapes (enough for ``init`` and ``eval_shape``)."""
    return sample_batch(self.x_train.shape[1:], self.x_train.dtype, self.y_train.shape[1:],
                        self.y_train.dtype, batch_size)

  def train(self, batch_size: int, seed: int, num_steps: int):
    """Random-access training batches: ``[s]`` is step ``s``'s ``{'x', 'y'}``."""
    return self.train_batches(batch_size, seed, num_steps)

  def eval(self, batch_size: int):
    """Evaluation batches (weights mark the padding of the last one)."""
    return pipeline.eval_batches(self.x_test, self.y_test, batch_size=batch_size)


def sample_batch(x_shape, x_dtype, y_shape, y_dtype, batch_size: int) -> dict[str, np.ndarray]:
  """A zero batch ``{'x': [batch_size, *x_shape], 'y': [batch_size, *y_shape]}``;
  integer inputs (token ids) are int32, other inputs float32."""
  x_dtype = np.int32 if np.issubdtype(np.dtype(x_dtype), np.integer) else np.float32
  return {'x': np.zeros((batch_size, *x_shape), x_dtype),
          'y': np.zeros((batch_size, *y_shape), np.dtype(y_dtype))}


def _arrays(ds: datasets.ArrayDataset) -> Data:
  def train(batch_size, seed, num_steps):
    return pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=batch_size, seed=seed,
                                  num_steps=num_steps)
  return Data(ds, train)


def _text(config: DataConfig) -> Data:
  expect(config.num_classes is None, 'num_classes', f'unset for the text dataset '
         f'{config.name!r} (bytes: {text.VOCAB_SIZE} tokens)', config.num_classes, ConfigError)
  ds = text.load(config.name, seq_len=config.seq_len)

  def train(batch_size, seed, num_steps):
    return text.train_dataset(ds, batch_size=batch_size, seed=seed, num_steps=num_steps)
  return Data(ds, train)


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """A row of the table.

  Attributes:
    load: ``DataConfig -> Data``.
    help: one line for ``--help`` and the README.
    tokens: a text data set (for language models).
    loss: the loss that fits it (:mod:`purax.core.objectives`).
    path: the data file in a name (``npz:PATH``), or None.
  """

  load: Callable[[DataConfig], Data]
  help: str
  tokens: bool = False
  loss: Callable = objectives.classification
  path: Callable[[str], str | None] = lambda name: None


def _after(prefix: str) -> Callable[[str], str]:
  return lambda name: name[len(prefix):] if name.startswith(prefix) else name


DATASETS: dict[str, DataSpec] = {
    'digits': DataSpec(lambda c: _arrays(datasets.load('digits', num_classes=c.num_classes)),
                       "scikit-learn's 8x8 handwritten digits, [8, 8, 1], 10 classes"),
    'mnist1d': DataSpec(lambda c: _arrays(datasets.load('mnist1d', num_classes=c.num_classes)),
                        'MNIST-1D (Greydanus 2020), generated offline, [40, 1], 10 classes'),
    'npz:': DataSpec(lambda c: _arrays(datasets.load(c.name, num_classes=c.num_classes)),
                     'npz:PATH: arrays x_train, y_train, x_test, y_test (+ num_classes)',
                     path=_after('npz:')),
    'pystdlib': DataSpec(_text, "the Python standard library's sources, as bytes",
                         tokens=True, loss=objectives.language_model),
    'text:': DataSpec(_text, 'text:PATH: any UTF-8 file, as bytes', tokens=True,
                      loss=objectives.language_model, path=_after('text:')),
}


def lookup(name: str) -> DataSpec:
  """The row of ``name``: an exact key, else its prefix (``npz:``, ``text:``),
  else a path ending in ``.npz``.

  Raises:
    ConfigError: no row fits, naming the known ones.
  """
  if name in DATASETS:
    return DATASETS[name]
  for key, spec in DATASETS.items():
    if key.endswith(':') and name.startswith(key) and len(name) > len(key):
      return spec
  if name.endswith('.npz'):
    return DATASETS['npz:']
  raise ConfigError(f"dataset: expected one of {[k for k in DATASETS if not k.endswith(':')]} "
                    f"or {[k + 'PATH' for k in DATASETS if k.endswith(':')]}, got {name!r}")
