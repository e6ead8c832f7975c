"""The pure functions of training: ``init``, ``step``, ``evaluate``, ``predict``.

A :class:`Task` bundles the static pieces — a model (any :mod:`purax.core.model`
interface: flax.linen, Flax NNX, plain functions, Equinox), an optax
transformation and a loss function (:mod:`purax.core.objectives`) — and its
methods are pure functions of explicit pytrees that compose with ``jax.jit``,
``jax.vmap``, ``jax.eval_shape`` and sharding. No method touches the host: no
scalar reads, no printing, no transfers.

The batch is whatever the data yields: the model's adapter picks its inputs
(``batch['x']`` by default) and the loss reads the rest. The provided losses
read ``'y'`` and an optional ``'weight'`` (0 = padding; see
:mod:`purax.core.objectives`).

Example:
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
  >>> state = task.init(jax.random.key(0), batch)      # batch: {'x': [64, 8, 8, 1], 'y': [64]}
  >>> step = jax.jit(task.step, donate_argnums=0)
  >>> state, metrics = step(state, batch)
  >>> purax.metrics.compute(metrics)['examples']       # the one host transfer
  64.0

  Your own loss, with a hyperparameter that populations can sweep:

  >>> @purax.loss_function(hparams={'temperature': 1.0})
  ... def tempered(logits, batch, hparams):             # logits: float32 [batch, classes]
  ...   values = optax.softmax_cross_entropy_with_integer_labels(
  ...       logits / hparams['temperature'], batch['y'])  # float32 [batch]
  ...   return values, batch.get('weight'), {'max_logit': logits.max(-1)}
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=optax.adam(1e-3), loss=tempered, hparams={'temperature': 0.5})
  >>> state = task.init(jax.random.key(0), batch)
  >>> float(state.hparams['temperature'])
  0.5
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import reprlib
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from purax.core import guards as guards_lib
from purax.core import loss_scale as loss_scale_lib
from purax.core import objectives
from purax.core import shapes
from purax.core import update
from purax.core.spikes import SpikeGuard
from purax.core.errors import ConfigError, DataError, expect, expect_kind
from purax.core.model import Model, as_model, select_inputs, takes_hparams
from purax.core.state import TrainState

PyTree = Any


def as_typed_key(key: jax.Array) -> jax.Array:
  """Accepts a typed key (``jax.random.key``) or a raw uint32 ``[2]`` key.

  Raises:
    ConfigError: anything else (an int seed, a float array), naming it.
  """
  dtype = getattr(key, 'dtype', None)
  if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
    return key
  expect(dtype is not None and jnp.shape(key)[-1:] == (2,) and dtype == jnp.uint32, 'key',
         'a typed PRNG key (jax.random.key(seed)) or a raw uint32 [2] key',
         f'{dtype}{list(jnp.shape(key))}' if dtype is not None else repr(key), ConfigError)
  return jax.random.wrap_key_data(key)


def _check_state(state) -> None:
  expect_kind(state, 'state', TrainState, 'a purax.TrainState (task.init(key, batch))')


def _check_axis_name(axis_name) -> None:
  """None, or a name (or tuple of names) bound by an enclosing pmap / shard_map."""
  if axis_name is None:
    return
  names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
  expect(all(isinstance(n, str) for n in names) and names, 'axis_name',
         'None, or the name (or tuple of names) of a pmap / shard_map axis',
         reprlib.repr(axis_name), ConfigError)
  try:
    jax.lax.axis_size(axis_name)
  except NameError:
    raise ConfigError(f'axis_name: expected the name of an axis of an enclosing pmap / '
                      f'shard_map, got {axis_name!r}, which none binds') from None


def _check_leaves(batch) -> None:
  """Every leaf of ``batch`` is an array or a number (what jit can take)."""
  for path, x in jax.tree_util.tree_flatten_with_path(batch)[0]:
    kind = getattr(getattr(x, 'dtype', None), 'kind', '')
    if not (isinstance(x, (np.ndarray, np.generic, jax.Array, jax.ShapeDtypeStruct,
                           numbers.Number)) and kind not in ('O', 'S', 'U')):
      # The message only when it is raised: repr of a batch costs milliseconds.
      expect(False, f'batch{jax.tree_util.keystr(path)}', 'an array of numbers',
             f'{type(x).__name__} {reprlib.repr(x)}', DataError)


# The abstract evaluations the host loop needs before every run (the state's
# and the outputs' shapes), jitted once per process so that their traces are
# cached by (task, shapes): a second fit with the same task traces nothing.
_abstract_init = jax.jit(lambda task, batch: task.init(jax.random.key(0), batch),
                         static_argnums=0)


@dataclasses.dataclass(frozen=True)
class Task:
  """The static half of training: what is computed, not the values.

  Attributes:
    model: a flax.linen module, a Flax NNX module, or a
      :class:`purax.core.model.Model` (``purax.NNX.from_constructor``,
      ``purax.Functions``, ``purax.nn.equinox.from_equinox``); see
      :mod:`purax.core.model`. ``pure_model`` is its adapter.
    tx: an optax transformation, e.g. :func:`purax.core.optim.adamw`.
    loss: ``(outputs, batch, hparams) -> (values, weight, metrics)``; see
      :mod:`purax.core.objectives` for the contract. Default: softmax
      cross-entropy on integer labels (:func:`objectives.classification`).
    hparams: values of the loss's and model's hyperparameters (``name ->
      float``) over the loss's declared defaults; each is a float32 ``[]``
      leaf of ``state.hparams`` (vmapped by populations).
    microbatches: gradient accumulation: each batch is split along its leading
      axis into this many microbatches scanned in sequence; one optimizer
      update per batch. See :mod:`purax.core.update`.
    skip_nonfinite: skip (and count) updates whose gradients are not finite,
      leaving params, optimizer state and model state bitwise unchanged.
    loss_scale: initial dynamic loss scale (e.g. ``2**15``) for float16
      training; ``None``: no loss scaling. The state is ``state.guards['loss_scale']``.
    eval_params: ``state -> params``: the params :meth:`evaluate` and
      :meth:`predict` use (so ``purax.evaluate``, the run's ``eval/*``, the
      best-k checkpoints ranked by them, export and ``purax.hooks.EMA``'s
      samples), when they are not the params trained: a schedule-free
      optimizer's average (:func:`purax.core.optimizers.schedule_free_eval_params`),
      or your own function of the state. ``None``: ``state.params``.
    spike_guard: a :class:`purax.core.spikes.SpikeGuard`: also skip (and
      count, ``metrics['spikes']``) updates whose loss or gradient norm is a
      spike above the recent history kept in ``state.guards['spikes']``;
      ``None`` (the default): off, and the step is the program it is without it.

  Raises:
    ConfigError: at construction, a value of the wrong kind (``tx`` not an
      optax transformation, ``hparams`` not a mapping) or out of range; a loss
      that couples examples with ``microbatches > 1``; a model that fits no
      adapter.
  """

  model: Any
  tx: optax.GradientTransformation
  loss: Callable = objectives.classification
  hparams: Mapping[str, float] | tuple = ()
  microbatches: int = 1
  skip_nonfinite: bool = True
  loss_scale: float | None = None
  eval_params: Callable | None = None
  spike_guard: SpikeGuard | None = None
  pure_model: Model = dataclasses.field(init=False, compare=False, hash=False, repr=False)

  def __post_init__(self):
    expect(all(callable(getattr(self.tx, f, None)) for f in ('init', 'update')), 'tx',
           'an optax transformation (with init and update)', type(self.tx).__name__,
           ConfigError)
    expect_kind(self.microbatches, 'microbatches', int, 'an integer >= 1')
    expect(self.microbatches >= 1, 'microbatches', 'an integer >= 1', self.microbatches,
           ConfigError)
    expect_kind(self.skip_nonfinite, 'skip_nonfinite', (bool, np.bool_), 'a bool')
    if self.loss_scale is not None:
      expect_kind(self.loss_scale, 'loss_scale', numbers.Real, 'a number >= 1 or None')
    expect(self.loss_scale is None or self.loss_scale >= 1, 'loss_scale',
           '>= 1 (an initial scale, a power of two) or None', self.loss_scale, ConfigError)
    expect(self.eval_params is None or callable(self.eval_params), 'eval_params',
           'None or a function state -> params (e.g. '
           'purax.core.optimizers.schedule_free_eval_params)',
           type(self.eval_params).__name__, ConfigError)
    expect_kind(self.spike_guard, 'spike_guard', (SpikeGuard, type(None)),
                'None or a purax.SpikeGuard(window, k)')
    expect(callable(self.loss), 'loss', 'a function (outputs, batch, hparams) -> (values, '
           'weight, metrics)', type(self.loss).__name__, ConfigError)
    expect(not (self.couples_examples and self.microbatches > 1), 'microbatches',
           f'1 for a loss that couples examples ({getattr(self.loss, "__name__", self.loss)}: '
           'each microbatch would see other negatives than the whole batch)',
           self.microbatches, ConfigError)
    try:
      hparams = dict(self.hparams)
    except (TypeError, ValueError):
      raise ConfigError(f'hparams: expected a mapping name -> float, got {self.hparams!r}'
                        ) from None
    for name, value in hparams.items():
      expect(isinstance(value, numbers.Real) and math.isfinite(value), f'hparams[{name!r}]',
             'a finite Python number', value, ConfigError)
    # A sorted tuple of pairs keeps the task hashable (a static jit argument).
    object.__setattr__(self, 'hparams', tuple(sorted((k, float(v)) for k, v in
                                                     hparams.items())))
    if 'label_smoothing' in hparams:
      expect(0.0 <= hparams['label_smoothing'] < 1.0, "hparams['label_smoothing']",
             'in [0, 1)', hparams['label_smoothing'], ConfigError)
    object.__setattr__(self, 'pure_model', as_model(self.model))
    declared = dict(objectives.spec_of(self.loss).hparams)
    unknown = sorted(set(hparams) - set(declared))
    expect(not unknown or takes_hparams(self.pure_model) is not False, 'hparams',
           f'names the loss declares ({sorted(declared)}) or that a model whose __call__ '
           'takes hparams= reads', f'unknown {unknown}', ConfigError)

  @property
  def couples_examples(self) -> bool:
    """Whether the loss declared that it couples examples (see :mod:`~purax.core.objectives`)."""
    return objectives.spec_of(self.loss).couples_examples

  def default_hparams(self) -> dict[str, jax.Array]:
    """The initial ``state.hparams``: the loss's declared defaults, then ``hparams``."""
    values = {**dict(objectives.spec_of(self.loss).hparams), **dict(self.hparams)}
    return {k: jnp.asarray(v, jnp.float32) for k, v in sorted(values.items())}

  def check_batch(self, batch: PyTree, state: TrainState | None = None) -> None:
    """Checks that the model and the loss accept ``batch`` (an abstract trace: free).

    Raises:
      DataError: the batch lacks what the model or the loss reads, or has
        the wrong shapes or dtypes (naming the field); ContractError: the loss
        breaks its contract.
    """
    if state is None:
      state = jax.eval_shape(lambda b: self.init(jax.random.key(0), b), batch)
    jax.eval_shape(lambda s, b: self.compute_loss(s.params, s.model_state, b, None,
                                                  hparams=s.hparams, train=False),
                   state, batch)

  def abstract_state(self, batch: PyTree) -> TrainState:
    """The state's shapes and dtypes (``jax.ShapeDtypeStruct`` leaves) for
    ``batch``'s: an abstract trace of :meth:`init`, cached per (task, shapes),
    nothing allocated or transferred."""
    _check_leaves(batch)
    return _abstract_init.eval_shape(self, batch)

  # -- the pure functions --

  def init(self, key: jax.Array, batch: PyTree) -> TrainState:
    """Builds the initial state from a key and a sample batch (only shapes matter).

    Runs under ``jax.jit``, ``jax.vmap`` (over keys) and ``jax.eval_shape``.

    Args:
      key: a typed PRNG key (or raw uint32 ``[2]``); split into the model's
        init key and ``state.rng``.
      batch: a sample batch (only shapes and dtypes matter).

    Returns:
      A :class:`TrainState` at step 0.

    Raises:
      ConfigError: ``key`` is not a key. DataError: the batch lacks what the
        model reads.
    """
    init_key, rng = jax.random.split(as_typed_key(key))
    params, model_state = self.pure_model.init(init_key, batch)
    shapes.record(self, params, batch)      # to name a later batch of another shape
    guards = {}                             # each guard's state (purax.core.guards)
    if self.loss_scale is not None:
      guards[guards_lib.LOSS_SCALE] = loss_scale_lib.LossScale.create(self.loss_scale)
    if self.spike_guard is not None:
      guards[guards_lib.SPIKES] = self.spike_guard.init()
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        model_state=model_state,
        opt_state=self.tx.init(params),
        rng=rng,
        hparams=self.default_hparams(),
        guards=guards,
    )
    self.check_batch(batch, state)   # a trace only: nothing is computed
    return state

  def compute_loss(self, params, model_state, batch: PyTree, key: jax.Array | None, *,
                   hparams=None, train: bool = True) -> tuple[jax.Array, dict[str, Any]]:
    """The objective of one batch: the weighted mean loss, float32 ``[]``.

    Args:
      params: the model's parameters.
      model_state: the model's other variables (``{}`` for none).
      batch: the batch.
      key: typed key for dropout (used only when ``train``).
      hparams: ``state.hparams``; defaults to :meth:`default_hparams`.
      train: training mode (dropout on, batch statistics updated).

    Returns:
      ``(loss, aux)``; ``aux`` holds ``'model_state'`` (updated in training,
      unchanged otherwise), ``'metrics'`` (a metrics tree), ``'outputs'``,
      ``'values'`` (the per-example / per-token losses) and ``'weight'``
      (float32 ``[]``, the total weight the loss is averaged over).

    Raises:
      ContractError: the loss returned something outside its contract.
      DataError: the batch lacks what the model or the loss reads.
    """
    if hparams is None:
      hparams = self.default_hparams()
    # numpy leaves (outside jit) as jax arrays, so a loss may index them with traced values
    batch = jax.tree.map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, batch)
    outputs, new_model_state = self._apply(
        params, model_state, batch, train=train, rng=key if train else None, hparams=hparams)
    loss, metrics, values, weight = objectives.reduce(self.loss, outputs, batch, hparams)
    return loss, {'model_state': new_model_state, 'metrics': metrics, 'outputs': outputs,
                  'values': values, 'weight': weight}

  def step(self, state: TrainState, batch: PyTree, *, axis_name=None, frozen=None
           ) -> tuple[TrainState, dict]:
    """One optimizer update: ``(state, batch) -> (state, metrics)``.

    Pure: the dropout key is ``fold_in(state.rng, state.step)``; nothing leaves
    the device. Metrics are the loss's metrics (sums and counts), the
    gradient's global norm and, with the non-finite guard, ``skipped`` /
    ``skip_streak``. Gradient accumulation, loss scaling and the guard are
    described in :mod:`purax.core.update`.

    Args:
      state: the state.
      batch: the batch (under ``axis_name``: this device's part of the global batch).
      axis_name: only inside ``pmap`` / ``shard_map``: the mapped axis (or axes)
        the global batch is split over. Gradients, metrics and weights are
        summed across it, so the update is the one of the global batch.
      frozen: bool ``[]`` or None; for populations (a member that no longer
        changes): turns the guard on and skips the update when set, every
        metric zero (see :func:`purax.core.update.step`).

    Raises:
      ConfigError: ``state`` not a :class:`TrainState`; ``axis_name`` not an
        axis bound by an enclosing ``pmap`` / ``shard_map``, or with a loss that
        couples examples; ``frozen`` not a bool ``[]``.
    """
    _check_state(state)
    _check_axis_name(axis_name)
    expect(frozen is None or (isinstance(frozen, (bool, np.bool_, np.ndarray, jax.Array))
                              and jnp.shape(frozen) == () and jnp.result_type(frozen) == bool),
           'frozen', 'None or a bool []', reprlib.repr(frozen), ConfigError)
    return update.step(self._train_loss, self.tx, state, batch, settings=self.settings,
                       axis_name=axis_name, frozen=frozen)

  def gradients(self, state: TrainState, batch: PyTree, *, axis_name=None
                ) -> tuple[PyTree, dict, PyTree]:
    """The gradients :meth:`step` applies to ``batch``: ``(grads, metrics,
    model_state)``, accumulated over microbatches, the loss scale removed,
    summed across ``axis_name``; with the step's dropout key. Pure.

    Raises:
      ConfigError: ``axis_name`` with a loss that couples examples.
    """
    _check_state(state)
    _check_axis_name(axis_name)
    return update.gradients(self._train_loss, state, batch, settings=self.settings,
                            axis_name=axis_name)

  @property
  def settings(self) -> update.Settings:
    """What :mod:`purax.core.update` needs of this task besides the loss and ``tx``."""
    return update.Settings(self.microbatches, self.skip_nonfinite, self.couples_examples,
                           self.spike_guard)

  def _train_loss(self, params, model_state, batch, key, hparams):
    return self.compute_loss(params, model_state, batch, key, hparams=hparams, train=True)

  def evaluation_params(self, state: TrainState) -> PyTree:
    """The params :meth:`evaluate` and :meth:`predict` use: ``eval_params(state)``,
    or ``state.params`` when the task has none. Pure (jit, vmap)."""
    return state.params if self.eval_params is None else self.eval_params(state)

  def evaluate(self, state: TrainState, batch: PyTree) -> dict:
    """Deterministic metrics of one batch (no dropout, batch statistics
    frozen), at :meth:`evaluation_params`.

    Examples with ``weight`` 0 (padding) do not count, so summing the metrics
    of padded batches counts every real example exactly once.
    """
    _check_state(state)
    _, aux = self.compute_loss(self.evaluation_params(state), state.model_state, batch, None,
                               hparams=state.hparams, train=False)
    return aux['metrics']

  def predict(self, state: TrainState, batch: PyTree) -> PyTree:
    """Model outputs in evaluation mode at :meth:`evaluation_params`, e.g.
    logits ``[batch, classes]``.

    ``batch`` is a batch; for a model that reads one key (``inputs='x'``, the
    default) the bare inputs array is accepted too.
    """
    _check_state(state)
    inputs = getattr(self.pure_model, 'inputs', None)
    if isinstance(inputs, str) and not isinstance(batch, Mapping):
      batch = {inputs: batch}
    outputs, _ = self._apply(self.evaluation_params(state), state.model_state, batch,
                             train=False, rng=None, hparams=state.hparams)
    return outputs

  def _apply(self, params, model_state, batch, **kwargs):
    """The model's ``apply``; where it fails on a batch whose per-example shape
    differs from the one the params were built from, a DataError naming that
    field and both shapes (:mod:`purax.core.shapes`) instead of the model's
    error about a parameter."""
    try:
      return self.pure_model.apply(params, model_state, batch, **kwargs)
    except Exception as e:
      message = shapes.mismatch(self, params, batch)
      if message is None:
        raise
      raise DataError(message) from e

  def inputs_of(self, batch: PyTree) -> PyTree:
    """What the model reads from ``batch`` (for tools: summaries, export)."""
    return select_inputs(batch, getattr(self.pure_model, 'inputs', 'x'))
