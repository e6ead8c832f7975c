"""The ``data`` config section, and a data set as the runs use it.

``--dataset`` takes a key of the one data-set table,
:data:`purax.io.datasets.DATASETS` (a loader, a help line, the loss that fits
the data), or your own function as ``MODULE:FUNCTION``
(:func:`purax.io.datasets.from_function`); ``--loss`` replaces the data
set's loss by a key of :data:`purax.core.objectives.BUILTIN` or your own
loss function as ``MODULE:FUNCTION`` (the contract of
:mod:`purax.core.objectives`). :meth:`DataConfig.load` gives a
:class:`Data`: the arrays, random-access training batches by step and
evaluation batches.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Annotated, Any, Callable

import tyro

from purax.app.fields import field
from purax.core import lazy
from purax.core.errors import ConfigError, expect

# Used by the methods, not by the definitions (the parser reads those): imported on use.
np = lazy.module('numpy')
objectives = lazy.module('purax.core.objectives')
datasets = lazy.module('purax.io.datasets')
pipeline = lazy.module('purax.io.pipeline')
text = lazy.module('purax.io.text')

INT32_LIMIT = 2 ** 31


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The data.

  Attributes:
    name: 'digits', 'mnist1d', or 'npz:PATH' (arrays x_train, y_train, x_test,
      y_test); for --model lm: 'pystdlib' (the Python standard library's
      sources) or 'text:PATH' (any UTF-8 file); or your own MODULE:FUNCTION
      returning (x_train, y_train, x_test, y_test) (purax.io.datasets.from_function).
    batch_size: examples per update.
    eval_batch_size: examples per evaluation batch (the last is padded).
    seq_len: tokens (bytes) per example of a text dataset (--model lm).
    num_classes: override the number of classes (npz data without num_classes).
    loss: the loss; when unset the data set's own (classification, language_model);
      a key of purax.core.objectives.BUILTIN, or your own MODULE:FUNCTION
      (outputs, batch, hparams) -> (values, weight, metrics) (purax.core.objectives).
  """

  name: Annotated[str, tyro.conf.arg(name='dataset')] = 'digits'
  batch_size: int = 64
  eval_batch_size: int = field(512, resumable=True)
  seq_len: int = 128
  num_classes: int | None = None
  loss: str | None = None

  @property
  def spec(self) -> datasets.Source:
    """The row of :data:`purax.io.datasets.DATASETS` that ``name`` selects."""
    return datasets.lookup(self.name)[0]

  def objective(self) -> Callable:
    """The loss: ``--loss`` (a key of :data:`purax.core.objectives.BUILTIN` or
    a user's import path, imported), else the one that fits the data.

    Raises:
      ConfigError: an unknown name, a path that does not import, or names
        no function (:func:`purax.core.lazy.user`).
    """
    if self.loss is None:
      return objectives.BUILTIN[self.spec.loss]
    if self.loss in objectives.BUILTIN:
      return objectives.BUILTIN[self.loss]
    if not lazy.is_import_path(self.loss):
      raise lazy.expected_path('loss', self.loss, sorted(objectives.BUILTIN), 'FUNCTION',
                               'mypkg.losses:my_loss')
    fn = lazy.user(self.loss, 'loss')
    expect(callable(fn), 'loss', f'{self.loss} to be a function (outputs, batch, hparams) -> '
           '(values, weight, metrics)', type(fn).__name__, ConfigError)
    return fn

  def loss_hparams(self) -> frozenset[str]:
    """The hyperparameters the loss declares (:func:`purax.loss_function`)."""
    return frozenset(dict(objectives.spec_of(self.objective()).hparams))

  def load(self) -> 'Data':
    """Loads the data set (ConfigError, DataError: naming what is wrong)."""
    ds = datasets.load(self.name, num_classes=self.num_classes, seq_len=self.seq_len)
    if self.spec.tokens:
      return Data(ds, functools.partial(text.train_dataset, ds))
    return Data(ds, functools.partial(pipeline.train_dataset, ds.x_train, ds.y_train))

  def validate(self) -> 'DataConfig':
    """Raises ConfigError naming the field, the expected and the actual value
    (your own data set's and loss's code is imported: ConfigError naming what fails)."""
    source, argument, _ = datasets.lookup(self.name)
    if source.user:
      datasets.user_function(argument)
    self.objective()
    for name in ('batch_size', 'eval_batch_size', 'seq_len'):
      value = getattr(self, name)
      expect(1 <= value < INT32_LIMIT, name, '>= 1 and < 2**31', value, ConfigError)
    expect(self.num_classes is None or 2 <= self.num_classes <= datasets.MAX_CLASSES, 'num_classes',
           f'in [2, {datasets.MAX_CLASSES}] or unset', self.num_classes, ConfigError)
    return self

  def with_absolute_path(self) -> 'DataConfig':
    """A data file's path made absolute, so that a saved run's eval, export,
    generate and resume work from any directory."""
    path = datasets.lookup(self.name)[2]
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
    train_batches: ``(*, batch_size, seed, num_steps) -> batches[step]``.
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

  def example_bytes(self) -> int:
    """Bytes of one example of :meth:`sample`'s batch (inputs and targets)."""
    x = int(np.prod(self.x_train.shape[1:], dtype=np.int64)) * 4      # int32 or float32
    y = int(np.prod(self.y_train.shape[1:], dtype=np.int64)) * np.dtype(self.y_train.dtype).itemsize
    return x + y

  def train(self, batch_size: int, seed: int, num_steps: int):
    """Random-access training batches: ``[s]`` is step ``s``'s ``{'x', 'y'}``."""
    return self.train_batches(batch_size=batch_size, seed=seed, num_steps=num_steps)

  def eval(self, batch_size: int):
    """Evaluation batches (weights mark the padding of the last one)."""
    return pipeline.eval_batches(self.x_test, self.y_test, batch_size=batch_size)


def sample_batch(x_shape, x_dtype, y_shape, y_dtype, batch_size: int) -> dict[str, np.ndarray]:
  """A zero batch ``{'x': [batch_size, *x_shape], 'y': [batch_size, *y_shape]}``;
  integer inputs (token ids) are int32, other inputs float32."""
  x_dtype = np.int32 if np.issubdtype(np.dtype(x_dtype), np.integer) else np.float32
  return {'x': np.zeros((batch_size, *x_shape), x_dtype),
          'y': np.zeros((batch_size, *y_shape), np.dtype(y_dtype))}
