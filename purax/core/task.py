"""The pure functions of training: ``init``, ``loss``, ``step``, ``evaluate``.

A :class:`Task` bundles the static pieces (a flax.linen model, an optax
transformation, the objective); its methods are pure functions of explicit
pytrees that compose with ``jax.jit``, ``jax.vmap``, ``jax.eval_shape`` and
sharding. No method touches the host: no scalar reads, no printing, no
transfers.

Batches are dicts of arrays:

- ``'x'``: inputs ``[batch, ...]``, floating dtype;
- ``'y'``: integer labels ``[batch]`` (classification) or float targets
  ``[batch, ...]`` (regression);
- ``'weight'`` (optional): float32 ``[batch]``; 0 marks padding. Losses and
  metrics are ``sum(weight * value) / sum(weight)``, so padded examples never
  count.

With ``objective='language_model'``, ``'x'`` is int tokens ``[batch, seq]``,
``'y'`` the next tokens ``[batch, seq]`` and ``'weight'`` is ``[batch]`` or
per token ``[batch, seq]``; the loss is the mean per-token cross-entropy.

Example::

  task = Task(model=purax.nn.CNN(num_classes=10),
              tx=purax.core.adamw(learning_rate=1e-3, total_steps=100))
  state = task.init(jax.random.key(0), batch)
  step = jax.jit(task.step, donate_argnums=0)
  state, metrics = step(state, batch)
  print(purax.core.metrics.compute(metrics))   # the one host transfer
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Literal, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from purax.core import losses
from purax.core import loss_scale as loss_scale_lib
from purax.core import update
from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, expect
from purax.core.state import TrainState

Batch = Mapping[str, jax.Array]
OBJECTIVES = ('classification', 'regression', 'language_model')


def as_typed_key(key: jax.Array) -> jax.Array:
  """Accepts a typed key (``jax.random.key``) or a raw uint32 ``[2]`` key."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return key
  return jax.random.wrap_key_data(key)


@dataclasses.dataclass(frozen=True)
class Task:
  """The static half of training: what is computed, not the values.

  Attributes:
    model: a flax.linen module called as ``model(x, train=bool)``; in training
      it may use the ``'dropout'`` rng and mutate non-param collections
      (``batch_stats``).
    tx: an optax transformation, e.g. :func:`purax.core.optim.adamw`.
    objective: ``'classification'`` (softmax cross-entropy on integer labels;
      metrics loss, accuracy, examples), ``'regression'`` (mean squared
      error; metrics loss, examples) or ``'language_model'`` (float32
      per-token cross-entropy of logits ``[batch, seq, vocab]`` against next
      tokens; metrics loss and accuracy per token, bits_per_byte = the
      negative log-likelihood (without label smoothing) / ln 2 (bits per
      token; per byte for byte-level data), tokens, examples).
    label_smoothing: initial value of ``state.hparams['label_smoothing']``.
    microbatches: gradient accumulation: each batch is split into this many
      microbatches scanned in sequence (the batch size must divide); one
      optimizer update per batch. See :mod:`purax.core.update`.
    skip_nonfinite: skip (and count) updates whose gradients are not finite,
      leaving the state bitwise unchanged.
    loss_scale: initial dynamic loss scale (e.g. ``2**15``) for float16
      training; ``None``: no loss scaling. The state is ``state.loss_scale``.
  """

  model: nn.Module
  tx: optax.GradientTransformation
  objective: Literal['classification', 'regression', 'language_model'] = 'classification'
  label_smoothing: float = 0.0
  microbatches: int = 1
  skip_nonfinite: bool = True
  loss_scale: float | None = None

  def __post_init__(self):
    expect(isinstance(self.microbatches, int) and self.microbatches >= 1, 'microbatches',
           'an integer >= 1', self.microbatches, ConfigError)
    expect(self.loss_scale is None or self.loss_scale >= 1, 'loss_scale',
           '>= 1 (an initial scale, a power of two) or None', self.loss_scale, ConfigError)
    expect(self.objective in OBJECTIVES, 'objective', f'one of {OBJECTIVES}',
           repr(self.objective), ConfigError)
    expect(0.0 <= self.label_smoothing < 1.0, 'label_smoothing', 'in [0, 1)',
           self.label_smoothing, ConfigError)

  # -- checks on static properties (run at trace time, never on the device) --

  def check_batch(self, batch: Batch) -> None:
    """Checks a batch's structure, dtypes and ranks (static, free under jit).

    Raises:
      DataError: naming the field, the expected and the actual value.
    """
    expect(isinstance(batch, Mapping), 'batch', "a dict with keys 'x' and 'y'",
           type(batch).__name__)
    for key in ('x', 'y'):
      expect(key in batch, f'batch[{key!r}]', 'present', f'keys {sorted(batch)}')
    x, y = batch['x'], batch['y']
    if self.objective == 'language_model':
      return _check_language_model_batch(x, y, batch.get('weight'))
    expect(jnp.ndim(x) >= 2, "batch['x'].shape", '[batch, ...features]', jnp.shape(x))
    expect(jnp.issubdtype(jnp.result_type(x), jnp.floating), "batch['x'].dtype",
           'a floating dtype', jnp.result_type(x))
    n = jnp.shape(x)[0]
    expect(jnp.shape(y)[:1] == (n,), "batch['y'].shape", f'[{n}, ...] (as batch x)',
           jnp.shape(y))
    if self.objective == 'classification':
      expect(jnp.ndim(y) == 1, "batch['y'].shape", f'[{n}] integer labels', jnp.shape(y))
      expect(jnp.issubdtype(jnp.result_type(y), jnp.integer), "batch['y'].dtype",
             'an integer dtype (class labels)', jnp.result_type(y))
    if 'weight' in batch:
      expect(jnp.shape(batch['weight']) == (n,), "batch['weight'].shape", f'[{n}]',
             jnp.shape(batch['weight']))

  # -- the pure functions --

  def init(self, key: jax.Array, batch: Batch) -> TrainState:
    """Builds the initial state from a key and a sample batch (only shapes matter).

    Runs under ``jax.jit``, ``jax.vmap`` (over keys) and ``jax.eval_shape``.

    Args:
      key: a typed PRNG key (or raw uint32 ``[2]``); split into the init key
        and ``state.rng``.
      batch: a sample batch; ``batch['x']`` fixes the input shape.

    Returns:
      A :class:`TrainState` at step 0.

    Raises:
      DataError: the batch is malformed.
    """
    self.check_batch(batch)
    init_key, rng = jax.random.split(as_typed_key(key))
    param_key, dropout_key = jax.random.split(init_key)
    variables = self.model.init({'params': param_key, 'dropout': dropout_key},
                                batch['x'], train=False)
    # Logical-axis annotations (nn.with_logical_partitioning) are metadata for
    # purax.parallel; the state holds plain arrays.
    variables = dict(nn.unbox(variables))
    params = variables.pop('params')
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        model_state=variables,
        opt_state=self.tx.init(params),
        rng=rng,
        hparams={'label_smoothing': jnp.asarray(self.label_smoothing, jnp.float32)},
        loss_scale=(None if self.loss_scale is None
                    else loss_scale_lib.LossScale.create(self.loss_scale)),
    )

  def loss(self, params, model_state, batch: Batch, key: jax.Array | None, *,
           hparams=None, train: bool = True) -> tuple[jax.Array, dict[str, Any]]:
    """The objective: weighted mean per-example loss, float32 ``[]``.

    Args:
      params: the model's parameters.
      model_state: non-trainable collections (``{}`` or ``{'batch_stats': ...}``).
      batch: ``{'x', 'y', optional 'weight'}`` as described in the module doc.
      key: typed key for dropout (only used when ``train``).
      hparams: ``state.hparams``; defaults to the task's initial values.
      train: training mode (dropout on, batch statistics updated).

    Returns:
      ``(loss, aux)``; ``aux`` holds ``'model_state'`` (updated in training,
      unchanged otherwise), ``'metrics'`` (a metrics tree of sums and counts),
      ``'outputs'`` (``[batch, ...]`` model outputs), ``'per_example_loss'``
      (float32 ``[batch]``) and ``'weight'`` (float32 ``[]``, the total weight
      the loss is averaged over).
    """
    if hparams is None:
      hparams = {'label_smoothing': jnp.asarray(self.label_smoothing, jnp.float32)}
    variables = {'params': params, **model_state}
    mutable = list(model_state) if (train and model_state) else False
    rngs = {'dropout': key} if (train and key is not None) else {}
    # Padding (weight 0) stays out of batch statistics of models that take a mask.
    extra = ({'mask': batch['weight'] > 0} if 'weight' in batch
             and 'mask' in inspect.signature(type(self.model).__call__).parameters else {})
    out = self.model.apply(variables, batch['x'], train=train, rngs=rngs,
                           mutable=mutable, **extra)
    outputs, new_model_state = out if mutable else (out, model_state)
    if self.objective == 'language_model':
      return _language_model_loss(outputs, batch, hparams, new_model_state)
    y = batch['y']
    n = y.shape[0]
    weight = batch.get('weight')
    weight = (jnp.ones((n,), jnp.float32) if weight is None
              else losses.at_least_float32(weight))
    if self.objective == 'classification':
      per_example = losses.softmax_cross_entropy(outputs, y, hparams['label_smoothing'])
      correct = (jnp.argmax(outputs, axis=-1) == y).astype(jnp.float32)
      metrics = {'accuracy': metrics_lib.Average.of(correct, weight)}
    else:
      per_example = losses.mean_squared_error(outputs, y)
      metrics = {}
    total_weight = jnp.sum(weight)
    loss = jnp.sum(per_example * weight) / jnp.maximum(total_weight, 1e-12)
    metrics['loss'] = metrics_lib.Average.of(per_example, weight)
    metrics['examples'] = metrics_lib.Sum.of(weight)
    aux = {'model_state': new_model_state, 'metrics': metrics, 'outputs': outputs,
           'per_example_loss': per_example, 'weight': total_weight}
    return loss, aux

  def step(self, state: TrainState, batch: Batch, *,
           axis_name=None) -> tuple[TrainState, dict]:
    """One optimizer update: ``(state, batch) -> (state, metrics)``.

    Pure: the dropout key is ``fold_in(state.rng, state.step)``; nothing leaves
    the device. Metrics are the batch's loss/accuracy sums and counts, the
    pre-clipping gradient global norm and, with the non-finite guard,
    ``skipped`` / ``skip_streak``. Gradient accumulation, loss scaling and the
    guard are described in :mod:`purax.core.update`.

    Args:
      state: the state; batch: the batch (under ``axis_name``: this device's
        part of the global batch).
      axis_name: only inside ``pmap`` / ``shard_map``: the mapped axis (or
        axes) the global batch is split over. Each device's loss is scaled
        by its share of the global batch weight before differentiation, the
        gradients are summed across the axis (equal shares: a ``pmean``) and
        so are the metrics: the update is the one of the global batch.
    """
    self.check_batch(batch)
    return update.step(self, state, batch, axis_name=axis_name)

  def evaluate(self, state: TrainState, batch: Batch) -> dict:
    """Deterministic metrics of one batch (no dropout, batch statistics frozen).

    Examples with ``weight`` 0 (padding) do not count, so summing the metrics
    of padded batches counts every real example exactly once.
    """
    self.check_batch(batch)
    _, aux = self.loss(state.params, state.model_state, batch, None,
                       hparams=state.hparams, train=False)
    return aux['metrics']

  def predict(self, state: TrainState, x: jax.Array) -> jax.Array:
    """Model outputs ``[batch, ...]`` in evaluation mode."""
    return self.model.apply({'params': state.params, **state.model_state}, x,
                            train=False)


def _check_language_model_batch(x, y, weight) -> None:
  """Static checks of a language-model batch (see the module doc)."""
  expect(jnp.ndim(x) == 2, "batch['x'].shape", '[batch, seq] token ids', jnp.shape(x))
  expect(jnp.issubdtype(jnp.result_type(x), jnp.integer), "batch['x'].dtype",
         'an integer dtype (token ids)', jnp.result_type(x))
  expect(jnp.shape(y) == jnp.shape(x), "batch['y'].shape",
         f'{list(jnp.shape(x))} (next tokens, as batch x)', jnp.shape(y))
  expect(jnp.issubdtype(jnp.result_type(y), jnp.integer), "batch['y'].dtype",
         'an integer dtype (token ids)', jnp.result_type(y))
  if weight is not None:
    n, seq = jnp.shape(x)
    expect(jnp.shape(weight) in ((n,), (n, seq)), "batch['weight'].shape",
           f'[{n}] or [{n}, {seq}]', jnp.shape(weight))


def _language_model_loss(logits, batch: Batch, hparams, model_state):
  """Mean per-token cross-entropy over the weighted tokens, and its metrics."""
  y = batch['y']
  weight = batch.get('weight')
  weight = (jnp.ones(y.shape, jnp.float32) if weight is None
            else losses.at_least_float32(weight))
  if weight.ndim == 1:
    weight = jnp.broadcast_to(weight[:, None], y.shape)
  per_token, nll = losses.token_cross_entropy_and_nll(logits, y, hparams['label_smoothing'])
  correct = (jnp.argmax(logits, axis=-1) == y).astype(jnp.float32)
  token_weight = jnp.sum(weight, axis=1)
  loss = jnp.sum(per_token * weight) / jnp.maximum(jnp.sum(token_weight), 1e-12)
  metrics = {
      'loss': metrics_lib.Average.of(per_token, weight),
      'accuracy': metrics_lib.Average.of(correct, weight),
      # bits per byte: the plain likelihood, also when training smooths labels
      'bits_per_byte': metrics_lib.Average.of(nll / jnp.log(2.0), weight),
      'tokens': metrics_lib.Sum.of(weight),
      'examples': metrics_lib.Sum.of(jnp.max(weight, axis=1)),
  }
  per_example = jnp.sum(per_token * weight, axis=1) / jnp.maximum(token_weight, 1e-12)
  aux = {'model_state': model_state, 'metrics': metrics, 'outputs': logits,
         'per_example_loss': per_example,
         'weight': jnp.sum(token_weight)}   # the loss's normaliser (microbatch sums)
  return loss, aux
