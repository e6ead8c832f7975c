"""Losses as functions: the contract, and the three provided objectives.

A loss is a pure function:

.. code-block:: text

  loss_fn(outputs, batch, hparams) -> (values, weight, metrics)

- ``outputs``: what the model returned (e.g. logits ``[batch, classes]``);
- ``batch``: the batch as the data yields it (any pytree);
- ``hparams``: ``state.hparams``, a dict of float32 ``[]`` arrays (e.g.
  ``{'temperature': 0.1}``; ``[members]`` never reaches the loss: populations
  vmap over it);
- ``values``: float ``[batch]`` (per example) or ``[batch, ...]`` (e.g. per
  token ``[batch, seq]``);
- ``weight``: ``None`` (every value counts 1) or a float array of ``values``'
  shape or of a prefix of it (``[batch]`` broadcast over the trailing axes);
  0 marks padding. The objective is ``sum(values * weight) / sum(weight)``;
- ``metrics``: a dict ``name -> metric``; a plain array is averaged by
  ``weight`` (``values``' shape or ``[batch]``: per value / per example;
  ``[]``: one number for the batch, weighted by its total weight); a
  :mod:`purax.core.metrics` object (``Average``, ``Sum``, ...) is kept as is.
  ``'loss'`` (the weighted mean of ``values``) and ``'examples'`` (the number
  of examples with a non-zero weight) are added unless present.

Declare hyperparameters and properties with :func:`loss_function`:

  >>> @purax.loss_function(hparams={'temperature': 0.1}, couples_examples=True)
  ... def centered(logits, batch, hparams):           # couples examples: the batch mean
  ...   logits = logits - logits.mean(0)
  ...   values = optax.softmax_cross_entropy_with_integer_labels(
  ...       logits / hparams['temperature'], batch['y'])
  ...   return values, batch.get('weight'), {}
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=optax.adam(1e-3), loss=centered)
  >>> task.couples_examples
  True

A loss that *couples examples* (contrastive losses, in-batch negatives)
computes something different on a part of the batch than on all of it, so
gradient accumulation (``microbatches > 1``) and the per-device paths
(``pmap`` / ``shard_map``, ``axis_name``) refuse it with a
:class:`~purax.core.errors.ConfigError`; ``jax.jit`` with shardings
(:func:`purax.parallel.sharded`) and populations compute it exactly.

Errors name the broken part of the contract (:class:`ContractError`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from purax.core import losses
from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, ContractError, expect

PyTree = Any


@dataclasses.dataclass(frozen=True)
class LossSpec:
  """What a loss function declares: its hyperparameters and whether it couples examples.

  Attributes:
    hparams: ``name -> default`` (Python floats), stored in ``state.hparams``.
    couples_examples: the loss of a batch is not a weighted mean of
      independent per-example terms (see the module docstring).
    check_values: ``(outputs_shape, batch) -> None`` on the host (numpy):
      raises :class:`DataError` for values the loss cannot take (labels out of
      range, negative weights); run by a plan's ``checks``.
  """

  hparams: tuple[tuple[str, float], ...] = ()
  couples_examples: bool = False
  check_values: Callable | None = None


def loss_function(fn: Callable | None = None, *, hparams: Mapping[str, float] | None = None,
                  couples_examples: bool = False, check_values: Callable | None = None):
  """Declares a loss function's hyperparameters (defaults) and properties.

  Usable as ``@loss_function`` or ``@loss_function(hparams=..., couples_examples=...)``.

  Args:
    fn: the loss ``(outputs, batch, hparams) -> (values, weight, metrics)``.
    hparams: ``name -> default``; each becomes a float32 ``[]`` leaf of
      ``state.hparams`` (vmappable by populations, swept like the learning rate).
    couples_examples: see the module docstring.
    check_values: optional host-side value check ``(outputs_shape, batch)``
      (see :class:`LossSpec`).

  Returns:
    ``fn`` itself, with a ``loss_spec`` attribute (:class:`LossSpec`).
  """
  def declare(f):
    f.loss_spec = LossSpec(hparams=tuple(sorted((k, float(v)) for k, v in
                                                (hparams or {}).items())),
                           couples_examples=bool(couples_examples),
                           check_values=check_values)
    return f
  return declare if fn is None else declare(fn)


def spec_of(fn: Callable) -> LossSpec:
  """The :class:`LossSpec` a loss declared (an undecorated function: none)."""
  return getattr(fn, 'loss_spec', LossSpec())


def _name(fn) -> str:
  return getattr(fn, '__qualname__', None) or repr(fn)


def reduce(fn: Callable, outputs, batch, hparams) -> tuple[jax.Array, dict, jax.Array, jax.Array]:
  """Calls ``fn`` and checks its result against the contract.

  Returns:
    ``(loss, metrics, values, total_weight)``: the weighted mean float32 ``[]``
    (at least float32), the metrics tree, ``values`` and ``sum(weight)``.

  Raises:
    ContractError: a result that does not fit the contract, naming the part.
  """
  where = f'loss {_name(fn)}'
  out = fn(outputs, batch, hparams)
  if not (isinstance(out, tuple) and len(out) == 3):
    raise ContractError(
        f'{where}: expected a tuple (values [batch, ...], weight or None, metrics dict), '
        f'got {type(out).__name__}' + (f' of length {len(out)}' if isinstance(out, tuple) else ''))
  values, weight, metrics = out
  expect(hasattr(values, 'shape') and jnp.ndim(values) >= 1
         and jnp.issubdtype(jnp.result_type(values), jnp.floating),
         f'{where}: values', 'a float array [batch] or [batch, ...]',
         _describe(values), ContractError)
  values = losses.at_least_float32(jnp.asarray(values))
  if weight is None:
    weight = jnp.ones(values.shape, values.dtype)
  else:
    shape = jnp.shape(weight)
    expect(hasattr(weight, 'shape') and values.shape[:len(shape)] == shape and len(shape) >= 1,
           f'{where}: weight', f'None or a float array of shape {list(values.shape)} or a '
           'prefix of it', _describe(weight), ContractError)
    weight = losses.at_least_float32(jnp.asarray(weight))
    weight = jnp.broadcast_to(weight.reshape(shape + (1,) * (values.ndim - len(shape))),
                              values.shape)
  expect(isinstance(metrics, Mapping), f'{where}: metrics', 'a dict name -> array or metric',
         type(metrics).__name__, ContractError)
  total = jnp.sum(weight)
  loss = jnp.sum(values * weight) / jnp.maximum(total, 1e-12)
  row_weight = weight.reshape(weight.shape[0], -1).max(axis=1)
  tree = {name: _as_metric(f'{where}: metrics[{name!r}]', m, values.shape, weight, row_weight,
                           total)
          for name, m in metrics.items()}
  tree.setdefault('loss', metrics_lib.Average.of(values, weight))
  tree.setdefault('examples', metrics_lib.Sum.of(row_weight > 0))
  return loss, tree, values, total


def _describe(x) -> str:
  if hasattr(x, 'shape') and hasattr(x, 'dtype'):
    return f'{jnp.dtype(x.dtype)}{list(x.shape)}'
  return type(x).__name__


def _as_metric(where, m, shape, weight, row_weight, total):
  if metrics_lib.is_metric(m):
    return m
  expect(hasattr(m, 'shape') or isinstance(m, (int, float)), where,
         'an array or a purax.metrics object (Average, Sum, ...)', type(m).__name__,
         ContractError)
  m = jnp.asarray(m, jnp.float32)
  if m.shape == shape:
    return metrics_lib.Average.of(m, weight)
  if m.shape == shape[:1]:
    return metrics_lib.Average.of(m, row_weight)
  shapes = [list(shape), list(shape[:1]), []] if len(shape) > 1 else [list(shape), []]
  expect(m.shape == (), where, f'shape {" or ".join(map(str, shapes))} (per value, per '
         'example, or one number for the batch)', list(m.shape), ContractError)
  return metrics_lib.Average(total=m * total, count=total)


# -- the provided objectives -----------------------------------------------


def _weight(batch, n_dims: int, shape) -> jax.Array | None:
  weight = batch.get('weight')
  if weight is None:
    return None
  expect(jnp.shape(weight) in [tuple(shape[:i]) for i in range(1, n_dims + 1)],
         "batch['weight'].shape", ' or '.join(str(list(shape[:i])) for i in range(1, n_dims + 1)),
         list(jnp.shape(weight)))
  return weight


def _labels(batch, outputs, *, expect_shape, what: str):
  expect(isinstance(batch, Mapping) and 'y' in batch, "batch['y']", f'present ({what})',
         f'keys {sorted(batch)}' if isinstance(batch, Mapping) else type(batch).__name__)
  y = batch['y']
  expect(jnp.shape(y) == tuple(expect_shape), "batch['y'].shape",
         f'{list(expect_shape)} ({what}, matching the model outputs '
         f'{list(getattr(outputs, "shape", jnp.shape(outputs)))})', list(jnp.shape(y)))
  return y


def _check_weight(batch) -> None:
  if isinstance(batch, Mapping) and 'weight' in batch:
    w = np.asarray(batch['weight'])
    expect(bool(np.all(np.isfinite(w)) and np.all(w >= 0)), "batch['weight']",
           'finite values >= 0 (0 marks padding)',
           f'min {np.nanmin(w) if w.size else "-"}, non-finite {int(np.sum(~np.isfinite(w)))}')


def _check_ids(batch, key: str, bound: int, what: str) -> None:
  if isinstance(batch, Mapping) and key in batch:
    v = np.asarray(batch[key])
    if v.size and np.issubdtype(v.dtype, np.integer):
      expect(bool(v.min() >= 0 and v.max() < bound), f"batch[{key!r}]",
             f'{what} in [0, {bound})', f'values in [{v.min()}, {v.max()}]')


def _check_classification(outputs_shape, batch) -> None:
  _check_ids(batch, 'y', outputs_shape[-1], 'class labels')
  _check_weight(batch)


def _check_regression(outputs_shape, batch) -> None:
  del outputs_shape
  if isinstance(batch, Mapping) and 'y' in batch:
    y = np.asarray(batch['y'])
    expect(bool(np.all(np.isfinite(y))), "batch['y']", 'finite targets',
           f'{int(np.sum(~np.isfinite(y)))} non-finite values')
  _check_weight(batch)


def _check_language_model(outputs_shape, batch) -> None:
  _check_ids(batch, 'y', outputs_shape[-1], 'next-token ids')
  _check_ids(batch, 'x', outputs_shape[-1], 'token ids')
  _check_weight(batch)


@loss_function(hparams={'label_smoothing': 0.0}, check_values=_check_classification)
def classification(logits, batch, hparams):
  """Softmax cross-entropy on integer labels, with label smoothing.

  Args:
    logits: ``[batch, classes]``, any float dtype (computed in float32).
    batch: ``{'y': int [batch] in [0, classes), 'weight': optional float [batch]}``.
    hparams: ``{'label_smoothing': float32 []}`` in ``[0, 1)``.

  Returns:
    ``(values [batch], weight, {'accuracy'})``.
  """
  expect(hasattr(logits, 'shape') and jnp.ndim(logits) == 2, 'model outputs',
         '[batch, classes] logits', _describe(logits))
  y = _labels(batch, logits, expect_shape=jnp.shape(logits)[:1], what='integer class labels')
  expect(jnp.issubdtype(jnp.result_type(y), jnp.integer), "batch['y'].dtype",
         'an integer dtype (class labels)', jnp.result_type(y))
  values = losses.softmax_cross_entropy(logits, y, hparams['label_smoothing'])
  correct = losses.top1_correct(logits, y)      # argmax(logits) == y
  return values, _weight(batch, 1, y.shape), {'accuracy': correct}


@loss_function(check_values=_check_regression)
def regression(predictions, batch, hparams):
  """Mean squared error over all but the batch axis.

  Args:
    predictions: ``[batch, ...]``.
    batch: ``{'y': float, same shape as predictions, 'weight': optional [batch]}``.
    hparams: unused.

  Returns:
    ``(values [batch], weight, {})``.
  """
  del hparams
  expect(hasattr(predictions, 'shape') and jnp.ndim(predictions) >= 1, 'model outputs',
         'an array [batch, ...]', _describe(predictions))
  y = _labels(batch, predictions, expect_shape=jnp.shape(predictions),
              what='float targets')
  return losses.mean_squared_error(predictions, y), _weight(batch, 1, jnp.shape(y)), {}


def _language_model(logits, batch, hparams, z_loss: float | None = None):
  """:func:`language_model`'s body; ``z_loss``: add ``z_loss * log(Z)**2``."""
  chunked = isinstance(logits, losses.ChunkedLogits)
  expect(hasattr(logits, 'shape') and len(logits.shape) == 3, 'model outputs',
         '[batch, seq, vocab] logits', _describe(logits))
  y = _labels(batch, logits, expect_shape=tuple(logits.shape[:2]), what='next-token ids')
  expect(jnp.issubdtype(jnp.result_type(y), jnp.integer), "batch['y'].dtype",
         'an integer dtype (token ids)', jnp.result_type(y))
  expect(not (chunked and z_loss is not None), 'z_loss',
         'a model returning full logits (a chunked loss has no z-loss)',
         f'z_loss={z_loss} with logits_chunk={getattr(logits, "chunk", None)}', ConfigError)
  weight = _weight(batch, 2, y.shape)
  # The loss, the plain NLL and the accuracy (label logit == max; ties count)
  # from one shifted copy of the logits: no argmax pass.
  if z_loss is None:
    values, nll, correct = (losses.chunked_token_losses if chunked else losses.token_losses)(
        logits, y, hparams['label_smoothing'])
  else:
    values, nll, correct, log_z = losses.token_losses(logits, y, hparams['label_smoothing'],
                                                      log_z=True)
    z = z_loss * jnp.square(log_z)
    values = values + z
  token_weight = (jnp.ones(y.shape, jnp.float32) if weight is None else
                  jnp.broadcast_to(jnp.reshape(weight, weight.shape + (1,) * (2 - weight.ndim)),
                                   y.shape).astype(jnp.float32))
  metrics = {'accuracy': correct, 'bits_per_byte': nll / jnp.log(2.0),
             'tokens': metrics_lib.Sum.of(token_weight)}
  if z_loss is not None:
    metrics['z_loss'] = z
  return values, weight, metrics


@loss_function(hparams={'label_smoothing': 0.0}, check_values=_check_language_model)
def language_model(logits, batch, hparams):
  """Per-token cross-entropy of next-token logits, in float32.

  Args:
    logits: ``[batch, seq, vocab]``, or a :class:`purax.core.losses.ChunkedLogits`
      (hidden states and output projection: the loss is then computed a chunk
      of tokens at a time, :func:`purax.core.losses.chunked_token_losses`).
    batch: ``{'y': int next tokens [batch, seq], 'weight': optional [batch] or
      [batch, seq]}``.
    hparams: ``{'label_smoothing': float32 []}``.

  Returns:
    ``(values [batch, seq], weight, metrics)``: metrics ``accuracy`` per token
    (the next token's logit is the largest; a tie for the largest counts),
    ``bits_per_byte`` (the plain negative log-likelihood / ln 2, without label
    smoothing: bits per token, per byte for byte-level data), ``tokens``.
    With a z-loss, :func:`language_model_loss`.
  """
  return _language_model(logits, batch, hparams)


@dataclasses.dataclass(frozen=True)
class _LanguageModelZLoss:
  """:func:`language_model` plus the z-loss (see :func:`language_model_loss`);
  frozen and compared by value, so a Task holding it stays a static jit argument."""

  z_loss: float
  loss_spec = language_model.loss_spec

  def __call__(self, logits, batch, hparams):
    return _language_model(logits, batch, hparams, self.z_loss)


def language_model_loss(*, z_loss: float = 0.0) -> Callable:
  """The language-model loss (:func:`language_model`), with an optional z-loss.

  The z-loss adds ``z_loss * log(Z)**2`` to every token's loss, ``Z`` the
  softmax normalizer (``sum(exp(logits))`` over the vocabulary): it keeps
  ``log Z`` near 0, which steadies training of large language models (PaLM,
  Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways",
  sec. 5, used ``1e-4``; MaxText's ``z_loss_multiplier``). The added term is
  logged as the metric ``z_loss`` (per token, weighted); ``bits_per_byte``
  stays the plain negative log-likelihood.

  Args:
    z_loss: the multiplier, >= 0 and finite; 0 returns :func:`language_model`
      itself (the same program as without the option).

  Returns:
    A loss function of the contract (``(logits [batch, seq, vocab], batch,
    hparams) -> (values [batch, seq], weight, metrics)``), hashable and
    compared by value.

  Raises:
    ConfigError: ``z_loss`` negative, not finite or not a number.

  Example: in a task, ``purax.Task(model=purax.nn.DecoderLM(...), tx=...,
  loss=purax.objectives.language_model_loss(z_loss=1e-4))``; called alone:

    >>> loss = purax.objectives.language_model_loss(z_loss=1e-4)
    >>> logits = jnp.zeros((2, 4, 16))                 # [batch, seq, vocab]: log Z = log 16
    >>> values, weight, metrics = jax.jit(loss)(logits, {'y': jnp.zeros((2, 4), jnp.int32)},
    ...                                         {'label_smoothing': 0.0})
    >>> values.shape                                   # per token
    (2, 4)
    >>> print(f"{float(metrics['z_loss'][0, 0]):.6f}")  # 1e-4 * log(16)**2
    0.000769
    >>> purax.objectives.language_model_loss(z_loss=0) is purax.objectives.language_model
    True
  """
  expect(isinstance(z_loss, (int, float)) and not isinstance(z_loss, bool)
         and math.isfinite(z_loss) and z_loss >= 0, 'z_loss', 'a finite number >= 0',
         repr(z_loss), ConfigError)
  return language_model if z_loss == 0 else _LanguageModelZLoss(float(z_loss))


#: The provided objectives by name (what a data set names as its loss).
BUILTIN = {'classification': classification, 'regression': regression,
           'language_model': language_model}
