"""Populations: whole training runs vmapped over hyperparameters and seeds.

A population is a :class:`TrainState` with a leading member axis on every leaf
(``jax.vmap(task.init)`` over keys), plus four per-member status arrays. Each
member's hyperparameters are float32 ``[]`` leaves of its own state: optimizer
ones in ``opt_state.hyperparams`` (``peak_learning_rate``, ``weight_decay``,
``b1``, ``b2``, ``eps``, ``clip_norm``), loss/model ones in ``state.hparams``
(``label_smoothing``). So a sweep over any values is one compiled program, and
a second sweep with other values of the same shapes reuses it.

The same :meth:`Task.step` and :meth:`Task.evaluate`, vmapped, train and
evaluate every member on one shared batch or on per-member batches. Member
``i`` computes exactly what a standalone run with hyperparameters ``i`` and key
``i`` computes; nothing mixes members.

A member whose loss, gradients or updated parameters become non-finite is
frozen: its state keeps its last finite value (``jnp.where`` over the tree),
``diverged[i]`` is set for good, and its metrics carry the flag. With dynamic
loss scaling (float16) a non-finite gradient is an overflow that the task's
guard skips and the halved scale cures: the member goes on. Early stopping
(:func:`early_stopping`) freezes a member whose eval metric stopped improving.
Frozen members still cost compute (vmap runs every lane) but never change.

Example::

  keys = jax.vmap(jax.random.key)(jnp.arange(4))
  hparams = {'peak_learning_rate': jnp.array([1e-4, 3e-4, 1e-3, 3e-3])}
  pop = population.init(task, keys, hparams, batch)
  pop, metrics = population.train_step(task, pop, zeros, batch)
  metrics_lib.compute(metrics)['loss']          # numpy [4]
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, expect
from purax.core.loss_scale import all_finite
from purax.core.state import TrainState

HParams = Mapping[str, jax.Array]   # name -> float32 [members]


class Population(struct.PyTreeNode):
  """A stacked training state and each member's status.

  Attributes:
    state: a :class:`TrainState` whose every leaf has a leading ``[members]``
      axis; ``member(pop, i)`` is member ``i``'s ordinary single-model state.
    diverged: bool ``[members]``; set (for good) when an update was non-finite.
    stopped: bool ``[members]``; set by :func:`early_stopping`.
    best: float32 ``[members]``, best eval metric seen (``+inf`` before the
      first evaluation; minimised, see :func:`early_stopping`).
    stale: int32 ``[members]``, evaluations since ``best`` last improved.
  """

  state: TrainState
  diverged: jax.Array
  stopped: jax.Array
  best: jax.Array
  stale: jax.Array

  @property
  def num_members(self) -> int:
    return int(jnp.shape(self.diverged)[0])

  @property
  def frozen(self) -> jax.Array:
    """bool ``[members]``: diverged or stopped; these members no longer change."""
    return self.diverged | self.stopped


# -- hyperparameters --------------------------------------------------------


def hparam_names(state: TrainState) -> tuple[str, ...]:
  """Names of the hyperparameters a (single or stacked) state carries."""
  return tuple(sorted(_opt_hparams(state)) + sorted(state.hparams))


def _opt_hparams(state: TrainState) -> dict:
  return dict(getattr(state.opt_state, 'hyperparams', None) or {})


def get_hparams(state: TrainState) -> dict[str, jax.Array]:
  """All hyperparameters of ``state``: optimizer ones then loss/model ones.

  For a stacked state each value is float32 ``[members]``.
  """
  return {**_opt_hparams(state), **dict(state.hparams)}


def set_hparams(state: TrainState, hparams: HParams) -> TrainState:
  """Returns ``state`` with hyperparameters replaced by float32 arrays.

  Names in ``opt_state.hyperparams`` (injected with
  ``optax.inject_hyperparams``, see :func:`purax.core.optim.adamw`) go there;
  names in ``state.hparams`` go there. Works on a single state (``[]`` values)
  or a stacked one (``[members]`` values).

  Raises:
    ConfigError: a name the state does not carry.
  """
  opt_hp, loss_hp = _opt_hparams(state), dict(state.hparams)
  for name, value in hparams.items():
    expect(name in opt_hp or name in loss_hp, 'hyperparameter name',
           f'one of {list(hparam_names(state))}', repr(name), ConfigError)
    value = jnp.array(value, jnp.float32, copy=True)   # a copy: a donated step deletes its input
    if name in opt_hp:
      opt_hp[name] = value
    else:
      loss_hp[name] = value
  opt_state = state.opt_state
  if opt_hp:
    opt_state = opt_state._replace(hyperparams=opt_hp)
  return state.replace(opt_state=opt_state, hparams=loss_hp)


def check_hparams(hparams: HParams, members: int) -> dict[str, jax.Array]:
  """Checks each value is a float ``[members]`` array; returns them as float32.

  Raises:
    ConfigError: a value of another shape or a non-float dtype, naming it.
  """
  out = {}
  for name, value in hparams.items():
    value = jnp.asarray(value)
    expect(value.shape == (members,), f'hparams[{name!r}].shape', f'[{members}] (members)',
           list(value.shape), ConfigError)
    expect(jnp.issubdtype(value.dtype, jnp.floating) or jnp.issubdtype(value.dtype, jnp.integer),
           f'hparams[{name!r}].dtype', 'a real dtype', value.dtype, ConfigError)
    out[name] = jnp.array(value, jnp.float32, copy=True)
  return out


# -- the pure functions -----------------------------------------------------


def init(task, keys: jax.Array, hparams: HParams, batch) -> Population:
  """``jax.vmap(task.init)`` over keys, then each member's hyperparameters.

  Args:
    task: a :class:`purax.core.task.Task`.
    keys: typed keys ``[members]`` (``jax.vmap(jax.random.key)(seeds)``) or raw
      uint32 ``[members, 2]``; member ``i`` is initialised exactly as
      ``task.init(keys[i], batch)``.
    hparams: name -> float ``[members]``; names as :func:`set_hparams`. Names
      left out keep the task's value for every member.
    batch: a sample batch (only shapes matter), shared by all members.

  Returns:
    A :class:`Population` with nothing diverged or stopped.

  Raises:
    ConfigError: no members, an unknown hyperparameter, or a value not
      ``[members]``. DataError: a malformed batch.
  """
  members = int(jnp.shape(keys)[0]) if jnp.ndim(keys) else 0
  expect(members >= 1, 'members', '>= 1', members, ConfigError)
  hparams = check_hparams(hparams, members)
  state = jax.vmap(lambda k, hp: set_hparams(task.init(k, batch), hp))(keys, hparams)
  return Population(state=state, diverged=jnp.zeros((members,), bool),
                    stopped=jnp.zeros((members,), bool),
                    best=jnp.full((members,), jnp.inf, jnp.float32),
                    stale=jnp.zeros((members,), jnp.int32))


def _member_step(task, state: TrainState, frozen: jax.Array, batch):
  new_state, metrics = task.step(state, batch)
  finite = (jnp.isfinite(metrics['loss'].total) & jnp.isfinite(metrics['grad_norm'].total)
            & all_finite(new_state.params))
  if 'skipped' in metrics and state.loss_scale is None:
    # The task's guard refused a non-finite update. Under dynamic loss scaling
    # that is an overflow, expected and handled (the scale halves): not a
    # divergence, so the member goes on with the guarded state.
    finite = finite & (metrics['skipped'].value == 0)
  keep_old = frozen | ~finite
  state = jax.tree.map(lambda new, old: jnp.where(keep_old, old, new), new_state, state)
  # A rejected update did not happen: its (non-finite) metrics count for nothing.
  metrics = jax.tree.map(lambda m: jnp.where(keep_old, jnp.zeros_like(m), m), metrics)
  return state, metrics, ~finite & ~frozen


# -- how members share the machine ---------------------------------------------

Strategy = Union[Literal['auto', 'vmap', 'chunked', 'sequential'], int]
STRATEGIES = ('auto', 'vmap', 'chunked', 'sequential')

# The 'auto' rule, measured (benchmarks/population.py --strategies, see
# AUTO_RULE_MEASURED): on CPU, XLA's batched matmul over many members is slower
# than the same work in chunks that stay in cache, so members run in vmapped
# chunks of CPU_CHUNK; on GPU/TPU one vmapped program over all members fills
# the device, so every member is vmapped.
CPU_CHUNK = 16
AUTO_RULE_MEASURED = 'see benchmarks/population.py'


def chunk_size(strategy: Strategy, members: int, platform: str | None = None) -> int:
  """Members per vmapped chunk that ``strategy`` runs (``members``: all vmapped, 1: one by one).

  Args:
    strategy: ``'vmap'`` (every member in one vmapped program), ``'sequential'``
      (``lax.map`` over members, one at a time), ``'chunked'`` (``lax.map`` over
      vmapped chunks of the platform's chunk size), an int ``C >= 1`` (chunks of
      ``C`` members; the last chunk holds the remainder), or ``'auto'``: on CPU
      chunks of :data:`CPU_CHUNK` members, elsewhere all members vmapped (the
      measured rule, see :data:`CPU_CHUNK`).
    members: the population size ``K >= 1``.
    platform: ``'cpu'``, ``'gpu'``, ``'tpu'``; default ``jax.default_backend()``.

  Returns:
    ``C`` in ``[1, members]``. Every strategy computes the same values (bitwise
    on CPU: each member's step is the same program whatever its neighbours).

  Raises:
    ConfigError: an unknown strategy or a chunk size < 1.
  """
  if isinstance(strategy, (int, np.integer)) and not isinstance(strategy, bool):
    expect(strategy >= 1, 'strategy', 'a chunk size >= 1', strategy, ConfigError)
    return min(int(strategy), members)
  expect(strategy in STRATEGIES, 'strategy', f'one of {list(STRATEGIES)} or a chunk size '
         '>= 1', repr(strategy), ConfigError)
  platform = platform or jax.default_backend()
  if strategy == 'vmap':
    return members
  if strategy == 'sequential':
    return 1
  if platform == 'cpu' or strategy == 'chunked':
    return min(CPU_CHUNK, members)
  return members


def _map_members(fn, chunk: int, *xs):
  """``jax.vmap(fn)(*xs)`` computed ``chunk`` members at a time (``xs``: ``[members, ...]``)."""
  members = jnp.shape(jax.tree.leaves(xs)[0])[0]
  if members == 1:   # the single-model program itself: no batched ops, no loop
    out = fn(*jax.tree.map(lambda x: x[0], xs))
    return jax.tree.map(lambda x: jnp.expand_dims(x, 0), out)
  if chunk >= members:
    return jax.vmap(fn)(*xs)
  if chunk == 1:
    return jax.lax.map(lambda a: fn(*a), xs)
  return jax.lax.map(lambda a: fn(*a), xs, batch_size=chunk)


def _member_batches(batch, batch_index):
  return jax.tree.map(lambda b: jnp.take(b, batch_index, axis=0), batch)


def step(task, pop: Population, batch, batch_index: jax.Array | None = None, *,
         strategy: Strategy = 'auto'):
  """One optimizer update of every active member: ``task.step`` vmapped.

  Args:
    task: the :class:`Task` every member runs.
    pop: the population; frozen members (diverged or stopped) keep their state.
    batch: a batch shared by all members (``{'x': [batch, ...], ...}``) when
      ``batch_index`` is None; else a stack of batches ``{'x': [n, batch, ...]}``
      of which member ``i`` uses number ``batch_index[i]``.
    batch_index: int32 ``[members]`` indices into ``batch``'s first axis, or
      None. ``jnp.arange(members)`` gives every member its own batch.
    strategy: how members share the machine (:func:`chunk_size`): all
      vmapped, vmapped chunks, one at a time, or ``'auto'``. The result is the
      same whichever (bitwise on CPU); only speed and memory differ.

  Returns:
    ``(pop, metrics)``: metrics as :meth:`Task.step`'s with a leading
    ``[members]`` axis (zero for frozen members), plus ``'diverged'``, an
    ``Average`` of the member's diverged flag after the step (1 once frozen by
    divergence).

  Raises:
    ConfigError: an unknown ``strategy``.
  """
  frozen = pop.frozen
  chunk = chunk_size(strategy, pop.num_members)
  if batch_index is None:
    state, metrics, newly = _map_members(lambda s, f: _member_step(task, s, f, batch), chunk,
                                         pop.state, frozen)
  else:
    state, metrics, newly = _map_members(lambda s, f, b: _member_step(task, s, f, b), chunk,
                                         pop.state, frozen, _member_batches(batch, batch_index))
  diverged = pop.diverged | newly
  metrics = dict(metrics)
  metrics['diverged'] = jax.vmap(metrics_lib.Average.of)(diverged.astype(jnp.float32))
  return pop.replace(state=state, diverged=diverged), metrics


def evaluate(task, pop: Population, batch, batch_index: jax.Array | None = None, *,
             strategy: Strategy = 'auto') -> dict:
  """``task.evaluate`` of every member (frozen ones too), ``[members]`` metrics.

  ``batch``, ``batch_index`` and ``strategy`` as in :func:`step`.
  """
  chunk = chunk_size(strategy, pop.num_members)
  if batch_index is None:
    return _map_members(lambda s: task.evaluate(s, batch), chunk, pop.state)
  return _map_members(task.evaluate, chunk, pop.state, _member_batches(batch, batch_index))


def score(metrics, name: str = 'loss', mode: Literal['min', 'max'] = 'min') -> jax.Array:
  """float32 ``[members]`` score to minimise from ``[members]`` metrics (jit-safe).

  ``mode='max'`` negates (e.g. accuracy). A member with no count or a
  non-finite value scores ``+inf`` (worst).

  Raises:
    ConfigError: ``name`` not among the metrics, or ``mode`` unknown.
  """
  expect(name in metrics, 'metric', f'one of {sorted(metrics)}', repr(name), ConfigError)
  expect(mode in ('min', 'max'), 'mode', "'min' or 'max'", repr(mode), ConfigError)
  m = metrics[name]
  if isinstance(m, metrics_lib.Average):
    value = m.total / jnp.where(m.count > 0, m.count, jnp.nan)
  else:
    value = m.value
  value = -value if mode == 'max' else value
  return jnp.where(jnp.isfinite(value), value, jnp.inf).astype(jnp.float32)


def early_stopping(pop: Population, scores: jax.Array, *, patience: int,
                   min_delta: float = 0.0) -> Population:
  """Per-member early stopping on an eval score (lower is better; pure).

  A member whose score has not improved on its best by more than
  ``min_delta`` for ``patience`` consecutive evaluations is stopped: it keeps
  its current state from then on. Diverged members are left as they are.

  Args:
    pop: the population.
    scores: float32 ``[members]``, e.g. :func:`score` of :func:`evaluate`.
    patience: evaluations without improvement before stopping (>= 1).
    min_delta: the improvement that counts.

  Returns:
    ``pop`` with ``best``, ``stale`` and ``stopped`` updated.

  Raises:
    ConfigError: ``patience < 1`` or ``scores`` not ``[members]``.
  """
  expect(patience >= 1, 'patience', '>= 1', patience, ConfigError)
  expect(jnp.shape(scores) == jnp.shape(pop.best), 'scores.shape',
         f'{list(jnp.shape(pop.best))} (members)', list(jnp.shape(scores)), ConfigError)
  scores = scores.astype(jnp.float32)
  improved = scores < pop.best - min_delta
  active = ~pop.frozen
  best = jnp.where(active & improved, scores, pop.best)
  stale = jnp.where(active, jnp.where(improved, 0, pop.stale + 1), pop.stale)
  stopped = pop.stopped | (active & ~pop.diverged & (stale >= patience))
  return pop.replace(best=best, stale=stale.astype(jnp.int32), stopped=stopped)


def member(pop: Population | TrainState, i: int) -> TrainState:
  """Member ``i``'s ordinary single-model :class:`TrainState` (no member axis)."""
  state = pop.state if isinstance(pop, Population) else pop
  return jax.tree.map(lambda x: x[i], state)


def stack(states: list[TrainState]) -> TrainState:
  """The inverse of :func:`member`: stacks single states along a new member axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *states)


# -- jitted entry points for host loops -------------------------------------


def _train_step(task, pop, acc, batch, batch_index=None, *, strategy: Strategy = 'auto'):
  pop, metrics = step(task, pop, batch, batch_index, strategy=strategy)
  return pop, metrics_lib.merge(acc, metrics)


def _eval_step(task, pop, acc, batch, batch_index=None, *, strategy: Strategy = 'auto'):
  return metrics_lib.merge(acc, evaluate(task, pop, batch, batch_index, strategy=strategy))


# Compiled once per (task, strategy, shapes): new hyperparameter values or seeds
# of the same member count reuse the program. The population and the running
# metrics are donated.
train_step = jax.jit(_train_step, static_argnums=0, static_argnames='strategy',
                     donate_argnums=(1, 2))
eval_step = jax.jit(_eval_step, static_argnums=0, static_argnames='strategy',
                    donate_argnums=2)


def zero_train_metrics(task, pop: Population, batch, batch_index=None) -> dict[str, Any]:
  """Zeroed ``[members]`` metrics accumulator of :func:`train_step` (no compute)."""
  return metrics_lib.zeros_like(
      jax.eval_shape(lambda p, b, i: step(task, p, b, i, strategy='vmap')[1], pop, batch,
                     batch_index))


def zero_eval_metrics(task, pop: Population, batch, batch_index=None) -> dict[str, Any]:
  """Zeroed ``[members]`` metrics accumulator of :func:`eval_step` (no compute)."""
  return metrics_lib.zeros_like(
      jax.eval_shape(lambda p, b, i: evaluate(task, p, b, i, strategy='vmap'), pop, batch,
                     batch_index))


def status(pop: Population) -> np.ndarray:
  """Host-side per-member status strings: ``'ok'``, ``'diverged'``, ``'stopped'``."""
  diverged, stopped = jax.device_get((pop.diverged, pop.stopped))
  return np.where(diverged, 'diverged', np.where(stopped, 'stopped', 'ok'))
