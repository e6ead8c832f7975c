"""Populations: whole training runs vmapped over hyperparameters and seeds.

A population is a :class:`TrainState` with a leading member axis on every leaf
(``jax.vmap(task.init)`` over keys), plus four per-member status arrays. Each
member's hyperparameters are float32 ``[]`` leaves of its own state: optimizer
ones in ``opt_state.hyperparams`` (``learning_rate``, ``weight_decay``,
``b1``, ``b2``, ``eps``, ``clip_norm``), loss/model ones in ``state.hparams``
(``label_smoothing``). So a sweep over any values is one compiled program, and
a second sweep with other values of the same shapes reuses it.

The same :meth:`Task.step` and :meth:`Task.evaluate`, vmapped, train and
evaluate every member on one shared batch or on per-member batches. Member
``i`` computes exactly what a standalone run with hyperparameters ``i`` and key
``i`` computes; nothing mixes members.

A member whose loss, gradients or hyperparameters become non-finite is
frozen: the task's non-finite guard (on in a population whatever
``task.skip_nonfinite`` says) skips that update, so its state keeps its last
finite value, including its ``step``; ``diverged[i]`` is set for good, and
its metrics carry the flag.
Parameters made non-finite by a finite update (a finite gradient times an
absurd learning rate) make the next step's loss non-finite: the member is
frozen there, keeping those parameters. With dynamic loss scaling (float16) a
non-finite gradient is an overflow that the guard skips and the halved scale
cures: the member goes on. Early stopping (:func:`early_stopping`) freezes a
member whose eval metric stopped improving. A frozen member's update is
skipped by the same ``lax.cond`` as a non-finite one (its gradients are still
computed; vmapped, the cond is a select).

How members share the machine is a ``strategy`` of :func:`step` and
:func:`evaluate` (:func:`chunk_size`): all vmapped, ``lax.map`` over vmapped
chunks, one at a time, or ``'auto'`` (a measured per-platform rule). Every
strategy makes the same decisions and computes the same values up to XLA's
shape-dependent summation order (bitwise when the program shape is the same:
``'sequential'`` member ``i`` is the standalone run ``i``).

Example:
  >>> from purax.core import population
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
  >>> keys = jax.vmap(jax.random.key)(jnp.arange(4))
  >>> hparams = {'learning_rate': jnp.array([1e-4, 3e-4, 1e-3, 3e-3])}
  >>> pop = population.init(task, keys, hparams, batch)
  >>> pop, metrics = jax.jit(population.step, static_argnums=0)(task, pop, batch)
  >>> purax.metrics.compute(metrics)['loss'].shape     # one loss per member
  (4,)

The compiled programs a host loop calls (the step with its metrics window,
the evaluation, their zeroed windows) are the population plan's
(:mod:`purax.plan.members`); :func:`is_population` is the one test of "is
this a population".
"""

from __future__ import annotations

from typing import Literal, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from purax.core import loops
from purax.core import metrics as metrics_lib
from purax.core import hparams as hparams_lib
from purax.core.errors import ConfigError, expect
from purax.core.state import TrainState
from purax.core.strategies import STRATEGIES as STRATEGIES
from purax.core.strategies import Strategy as Strategy

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


def is_population(x) -> bool:
  """Whether ``x`` is a :class:`Population` (a stacked state with its members'
  status), not a single :class:`TrainState`: the one test of it."""
  return isinstance(x, Population)


# -- hyperparameters --------------------------------------------------------


def check_hparams(hparams: HParams, members: int) -> dict[str, jax.Array]:
  """Checks each value is a real ``[members]`` array of finite values in
  bounds (:func:`purax.core.hparams.check`; a traced value, under ``jit``, is
  checked for shape and dtype only); returns them as float32.

  Raises:
    ConfigError: a value of another shape or dtype, or a member's value
      non-finite or out of bounds (``hyperparameter NAME[i]``), naming it.
  """
  out = {}
  for name, value in hparams.items():
    value = jnp.asarray(value)
    expect(value.shape == (members,), f'hparams[{name!r}].shape', f'[{members}] (members)',
           list(value.shape), ConfigError)
    expect(jnp.issubdtype(value.dtype, jnp.floating) or jnp.issubdtype(value.dtype, jnp.integer),
           f'hparams[{name!r}].dtype', 'a real dtype', value.dtype, ConfigError)
    hparams_lib.check(name, value)
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
    hparams: name -> float ``[members]``; names as :func:`purax.core.hparams.set`. Names
      left out keep the task's value for every member.
    batch: a sample batch (only shapes matter), shared by all members.

  Returns:
    A :class:`Population` with nothing diverged or stopped.

  Raises:
    ConfigError: no members, an unknown hyperparameter, a value not
      ``[members]``, or a concrete member's value non-finite or out of bounds
      (:func:`check_hparams`). DataError: a malformed batch.
  """
  members = int(jnp.shape(keys)[0]) if jnp.ndim(keys) else 0
  expect(members >= 1, 'members', '>= 1', members, ConfigError)
  hparams = check_hparams(hparams, members)
  state = jax.vmap(lambda k, hp: hparams_lib.set(task.init(k, batch), hp))(keys, hparams)
  return Population(state=state, diverged=jnp.zeros((members,), bool),
                    stopped=jnp.zeros((members,), bool),
                    best=jnp.full((members,), jnp.inf, jnp.float32),
                    stale=jnp.zeros((members,), jnp.int32))


def _member_step(task, state: TrainState, frozen: jax.Array, batch):
  """One member's step: skipped when frozen; a non-finite update freezes it.

  ``task.step(state, batch, frozen=frozen)``: its non-finite guard on
  (whatever ``task.skip_nonfinite`` says) and told ``frozen``: the guard's ``lax.cond``
  leaves params, optimizer and model state as they were for a frozen member
  or a non-finite update, without a select over the state (a select, or a
  ``lax.cond`` around the whole step, keeps the old state alive beside the
  new one, which makes XLA copy it every step: measured, a tenth of a small
  member's step). The guard also zeroes a frozen member's metrics and keeps
  its loss scale; only the ``step`` of a frozen or diverging member is
  selected here.
  """
  new_state, metrics = task.step(state, batch, frozen=frozen)
  # Without loss scaling every skipped update is a divergence; with it a skip
  # is an overflow, expected and handled (the scale halves). Divergence is
  # what the guard sees (the loss and the gradients' norm, which the step
  # computes anyway, and the member's hyperparameters): params made
  # non-finite by a finite update (a finite gradient times an absurd
  # learning rate) are caught at the member's next
  # step, whose loss they make non-finite. Checking the params themselves
  # every step was measured at ~5% of a small member's step.
  newly = (jnp.zeros((), bool) if state.guards.get('loss_scale') is not None
           else metrics['skipped'].value > 0)       # never set for a frozen member
  new_state = new_state.replace(step=jnp.where(frozen | newly, state.step, new_state.step))
  return new_state, metrics, newly


# -- how members share the machine (the names: purax.core.strategies) ---------

#: Members per chunk of ``'chunked'`` without a size.
CHUNK = 8

#: The most members the command line trains as one population (``purax
#: sweep``, ``purax tune lr --num-lrs``): each holds a whole training state,
#: and the hyperparameter arrays, metrics and reports are per member.
MAX_MEMBERS = 2 ** 16

#: The ``'auto'`` rule: members per chunk on CPU; elsewhere all members
#: vmapped (one program fills a GPU/TPU). The CPU's rule was measured
#: (``benchmarks/README.md``, "Population strategies on the CPU").
AUTO_CPU_CHUNK = 1


def chunk_size(strategy: Strategy, members: int, platform: str | None = None) -> int:
  """Members per vmapped chunk that ``strategy`` runs (``members``: all vmapped, 1: one by one).

  Args:
    strategy: ``'vmap'`` (every member in one vmapped program), ``'sequential'``
      (``lax.map`` over members, one at a time), ``'chunked'`` (``lax.map`` over
      vmapped chunks of :data:`CHUNK` members), an int ``C >= 1`` (chunks of
      ``C`` members; the last chunk holds the remainder), or ``'auto'``: on CPU
      chunks of :data:`AUTO_CPU_CHUNK` (one member at a time), elsewhere all
      members vmapped (the measured rule, see :data:`AUTO_CPU_CHUNK`).
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
  if strategy == 'chunked':
    return min(CHUNK, members)
  return min(AUTO_CPU_CHUNK, members) if platform == 'cpu' else members


def _slice(tree, start, size: int):
  return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, size), tree)


def _update(tree, part, start):
  return jax.tree.map(lambda x, p: jax.lax.dynamic_update_slice_in_dim(x, p, start, 0),
                      tree, part)


def _map_members(fn, chunk: int, state, *xs, updates_state: bool):
  """``jax.vmap(fn)(state, *xs)``, computed ``chunk`` members at a time.

  ``fn(state_i, *xs_i)`` returns ``(new_state_i, out_i)`` when ``updates_state``,
  else ``out_i``; every ``xs`` leaf has a leading ``[members]`` axis. Chunks run
  in a ``fori_loop`` (unrolled on the CPU when ``fn`` has convolutions,
  :mod:`purax.core.loops`) that writes each chunk's new state into the stacked state
  in place (the population is donated) and its ``out`` into a ``[members]``
  buffer: a call allocates no new state-sized buffer (``lax.map`` would stack
  fresh ones, and on CPU a fresh buffer the size of a large population costs
  more than the step, measured). A chunk of one member runs ``fn`` unbatched:
  the single-model program.
  """
  members = jnp.shape(jax.tree.leaves(state)[0])[0]
  unbatched = lambda f, *a: jax.tree.map(   # noqa: E731
      lambda x: jnp.expand_dims(x, 0), f(*jax.tree.map(lambda x: x[0], a)))
  if members == 1:   # the single-model program itself: no batched ops, no loop
    return unbatched(fn, state, *xs)
  if chunk >= members:
    return jax.vmap(fn)(state, *xs)
  shapes = jax.eval_shape(jax.vmap(fn), state, *xs)
  outs = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                      shapes[1] if updates_state else shapes)

  def run(carry, start, size):
    st, outs = carry
    part = (_slice(st, start, size), *_slice(xs, start, size))
    result = unbatched(fn, *part) if size == 1 else jax.vmap(fn)(*part)
    if updates_state:
      new, result = result
      st = _update(st, new, start)
    return st, _update(outs, result, start)

  n, remainder = divmod(members, chunk)
  carry = loops.fori_loop(0, n, lambda i, c: run(c, i * chunk, chunk), (state, outs))
  if remainder:
    carry = run(carry, n * chunk, remainder)
  return carry if updates_state else carry[1]


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
  def member_step(state, frozen, *member_batch):
    state, metrics, newly = _member_step(task, state, frozen, *(member_batch or (batch,)))
    return state, (metrics, newly)

  xs = (frozen,) if batch_index is None else (frozen, _member_batches(batch, batch_index))
  state, (metrics, newly) = _map_members(member_step, chunk, pop.state, *xs, updates_state=True)
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
    return _map_members(lambda s: task.evaluate(s, batch), chunk, pop.state,
                        updates_state=False)
  return _map_members(task.evaluate, chunk, pop.state, _member_batches(batch, batch_index),
                      updates_state=False)


def score(metrics, name: str = 'loss', mode: Literal['min', 'max'] = 'min') -> jax.Array:
  """float32 ``[members]`` score to minimise from ``[members]`` metrics (jit-safe).

  ``metrics[name]`` is a :mod:`purax.core.metrics` value (``Average``, ``Sum``)
  or an array of values. ``mode='max'`` negates (e.g. accuracy). A member with
  no count or a non-finite value scores ``+inf`` (worst): the rule of
  :class:`purax.core.metrics.Best` (:func:`purax.core.metrics.to_minimise`).

  Raises:
    ConfigError: ``name`` not among the metrics, or ``mode`` unknown.
  """
  expect(name in metrics, 'metric', f'one of {sorted(metrics)}', repr(name), ConfigError)
  expect(mode in ('min', 'max'), 'mode', "'min' or 'max'", repr(mode), ConfigError)
  m = metrics[name]
  if isinstance(m, metrics_lib.Average):
    value = m.total / jnp.where(m.count > 0, m.count, jnp.nan)
  else:
    value = getattr(m, 'value', m)
  return metrics_lib.to_minimise(jnp.asarray(value), mode)


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
  state = pop.state if is_population(pop) else pop
  return jax.tree.map(lambda x: x[i], state)


def stack(states: list[TrainState]) -> TrainState:
  """The inverse of :func:`member`: stacks single states along a new member axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def status(pop: Population) -> np.ndarray:
  """Host-side per-member status strings: ``'ok'``, ``'diverged'``, ``'stopped'``."""
  diverged, stopped = jax.device_get((pop.diverged, pop.stopped))
  return np.where(diverged, 'diverged', np.where(stopped, 'stopped', 'ok'))


from purax.core import lazy as _lazy  # noqa: E402

# The compiled programs moved beside the population's plan in 0.3
# (purax.plan.members); the spellings here work, deprecated, until 0.4.
__getattr__, _ = _lazy.attach(__name__, {}, deprecated={
    name: (f'purax.plan.members:{name}', f'purax.plan.members.{name}', '0.4')
    for name in ('train_step', 'eval_step', 'zero_train_metrics', 'zero_eval_metrics')})
