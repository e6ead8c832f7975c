"""The hook library: early stopping (one run and per member), PBT, EMA and
histograms, on the protocol of :mod:`purax.hooks`."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from purax.core import metrics as metrics_lib
from purax.core import pbt
from purax.core import population as pop_lib
from purax.core.errors import ConfigError, expect
from purax.hooks.record import End, Output


def scores(record: dict, metric: str, mode: str) -> jax.Array:
  """float32 scores to minimise from ``record[metric]`` (a number, or
  ``[members]``; a bare name means ``eval/NAME``), by the one rule of
  :class:`purax.core.metrics.Best`.

  Raises:
    ConfigError: the metric was not written at this step.
  """
  return jnp.asarray(metrics_lib.Best(metric, mode).score(record))


@dataclasses.dataclass
class EarlyStopping:
  """Stops a run after ``patience`` checks without an improvement of more
  than ``min_delta`` in ``metric``; its best score and counter are checkpointed.

  Which metric and which direction is :class:`purax.core.metrics.Best`, the
  rule ``--keep-best`` ranks checkpoints by (``purax train --best-metric
  eval/loss --best-mode min --patience 3`` uses one for both).

  The run then ends ``early_stopped`` (:class:`purax.hooks.End`, with the
  metric, its best value and the step that had it): checkpointed, and a
  resume of it trains nothing (``purax train`` says so) unless ``patience``
  is raised.

  Attributes:
    metric: a logged name (``'eval/loss'``, ``'train/loss'``, ...; a bare
      ``'loss'`` means ``'eval/loss'``).
    mode: ``'min'`` or ``'max'``.
    patience: checks without improvement before stopping (>= 1).
    min_delta: the improvement that counts.
    every: when it checks: 0 after every evaluation (an ``eval/*`` metric),
      or the log cadence for a ``train/*`` one.
    best, best_step: the best score so far (to minimise: ``-accuracy`` for
      ``'max'``) and its step; ``stale``: checks since.
  """

  metric: str = 'loss'
  mode: Literal['min', 'max'] = 'min'
  patience: int = 3
  min_delta: float = 0.0
  every: int = 0
  best: float = math.inf
  stale: int = 0
  best_step: int | None = None
  name: str = 'early_stopping'
  order: int = 5          # after evaluation, EMA and your hooks; before the checkpoint

  def __post_init__(self):
    expect(isinstance(self.patience, int) and self.patience >= 1, 'patience', '>= 1',
           self.patience, ConfigError)
    self.rule = metrics_lib.Best(self.metric, self.mode)    # checks both

  def __call__(self, info):
    if info.forced or self.rule.key not in info.metrics:
      return None         # only its cadence's checks count (the last step's too)
    score = float(self.rule.score(info.metrics))
    if score < self.best - self.min_delta:
      self.best, self.stale, self.best_step = score, 0, info.step
    else:
      self.stale += 1
    stop = None
    if self.stale >= self.patience:
      best = -self.best if self.mode == 'max' else self.best
      stop = End('early_stopped', info.step,
                 f'{self.rule.key} did not improve on {best:.6g} (step {self.best_step}) for '
                 f'{self.stale} checks (patience {self.patience})',
                 metric=self.rule.key, best=best, best_step=self.best_step)
    return Output(metrics={'early_stopping/stale': self.stale}, stop=stop)

  def state_dict(self) -> dict:
    return {'best': self.best if math.isfinite(self.best) else None, 'stale': self.stale,
            'best_step': self.best_step, 'metric': self.rule.key, 'mode': self.mode}

  def load_state_dict(self, d: dict) -> None:
    if (d.get('metric', self.rule.key), d.get('mode', self.mode)) != (self.rule.key, self.mode):
      return      # another rule: its best and count mean nothing for this one
    self.best = math.inf if d.get('best') is None else float(d['best'])
    self.stale = int(d['stale'])
    self.best_step = d.get('best_step')


_early_stopping = jax.jit(pop_lib.early_stopping, static_argnames=('patience', 'min_delta'))


@dataclasses.dataclass
class PopulationEarlyStopping:
  """Per-member early stopping (:func:`purax.core.population.early_stopping`) at
  every evaluation; its state (best, stale, stopped) lives in the Population."""

  metric: str = 'loss'
  mode: Literal['min', 'max'] = 'min'
  patience: int = 3
  every: int = 0
  name: str = 'population_early_stopping'

  def __call__(self, info):
    if info.forced:
      return None   # only its cadence's checks count (the last step's too)
    return Output(state=_early_stopping(
        info.state, jnp.asarray(scores(info.metrics, self.metric, self.mode)),
        patience=self.patience))


@dataclasses.dataclass
class PBT:
  """Population-based training (Jaderberg et al. 2017): every ``every`` steps,
  after an evaluation at that step, the worst ``fraction`` of members copy the
  best members' state and perturb their hyperparameters
  (:func:`purax.core.pbt.exploit_explore`, keyed by ``fold_in(key, step)``).

  ``every`` must be a multiple of ``fit``'s ``eval_every`` (PBT ranks members
  by their evaluation at that step): :meth:`check` says so. ``names`` and
  ``bounds``: the hyperparameters perturbed and their clip intervals (as
  :func:`purax.core.pbt.exploit_explore`).
  """

  every: int
  metric: str = 'loss'
  mode: Literal['min', 'max'] = 'min'
  fraction: float = 0.25
  key: Any = None
  names: tuple[str, ...] | None = None
  bounds: Any = None
  name: str = 'pbt'

  def check(self, eval_every: int) -> None:
    """Raises ConfigError unless PBT's cadence falls on evaluations."""
    expect(self.every >= 1, 'pbt_every', '>= 1', self.every, ConfigError)
    expect(eval_every >= 1 and self.every % eval_every == 0, 'pbt_every',
           f'a multiple of eval_every={eval_every} (PBT ranks members by the evaluation '
           'at its step)', self.every, ConfigError)

  def __call__(self, info):
    if info.end is not None:
      return None   # the last step: members keep the hyperparameters they trained with
    key = jax.random.key(0) if self.key is None else self.key
    pop, out = pbt.exploit_explore(
        info.state, jnp.asarray(scores(info.metrics, self.metric, self.mode)),
        key=jax.random.fold_in(key, info.step), fraction=self.fraction, names=self.names,
        bounds=self.bounds)
    return Output(state=pop, metrics={'pbt/source': np.asarray(out['source'])})


def _params_of(state):
  """The params of a :class:`TrainState`, or the stacked ``[members]`` params
  of a :class:`purax.core.population.Population`."""
  return state.state.params if pop_lib.is_population(state) else state.params


@functools.partial(jax.jit, static_argnums=0)
def _sample(params_of, state):
  """``params_of`` of a state, or of every member of a population (vmapped)."""
  if pop_lib.is_population(state):
    return jax.vmap(params_of)(state.state)
  return params_of(state)


def _with_params(state, params):
  if pop_lib.is_population(state):
    return state.replace(state=state.state.replace(params=params))
  return state.replace(params=params)


def _average_dtype(x):
  """float32 for floating params (bfloat16 ones included), their own dtype otherwise."""
  return jnp.float32 if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype


#: How an average begins (:class:`EMA` ``correction``).
CORRECTIONS = ('warmup', 'debias', None)


@functools.partial(jax.jit, static_argnames='correction')
def _ema_update(average, params, decay, correction):
  """The average after one more sample ``params``, in float32, leaf by leaf.

  With ``n`` the samples before this one: ``'debias'`` weighs the samples
  taken as ``decay**age`` normalised to sum to one (optax ``ema(debias=True)``,
  Adam's bias correction: the first sample is the average); ``'warmup'`` uses
  ``decay_n = min(decay, (1 + n) / (10 + n))`` from the starting params
  (TensorFlow's ``ExponentialMovingAverage(num_updates=)``, timm's warm-up);
  None: ``decay`` from the starting params.
  """
  n = average['count'].astype(jnp.float32)
  if correction == 'debias':
    rate = (1 - decay) / (1 - decay ** (n + 1))   # 1 at the first sample
    keep = 1 - rate
  elif correction == 'warmup':
    keep = jnp.minimum(decay, (1 + n) / (10 + n))
    rate = 1 - keep
  else:
    keep, rate = decay, 1 - decay

  def one(a, p):
    if not jnp.issubdtype(a.dtype, jnp.floating):
      return p.astype(a.dtype)
    return keep * a + rate * p.astype(a.dtype)
  return {'params': jax.tree.map(one, average['params'], params),
          'count': average['count'] + 1}


@dataclasses.dataclass
class EMA:
  """An exponential moving average of the params, sampled every ``every`` steps
  (Polyak averaging), checkpointed, so a resumed run continues the same average.

  How the average begins (``correction``), after samples ``p_1 .. p_n``:

  - ``'warmup'`` (default): from the run's first params with the decay
    ``decay_n = min(decay, (1 + n) / (10 + n))`` (TensorFlow's
    ``ExponentialMovingAverage(num_updates=)``, timm's warm-up): about the
    last tenth of the samples early on, the plain average once ``decay_n``
    reaches ``decay`` (``n`` about 9,000 at 0.999).
  - ``'debias'``: ``sum_i decay**(n-i) p_i / sum_i decay**(n-i)``, bias-corrected
    as Adam's moments (Kingma & Ba 2015, sec. 3; optax ``ema(debias=True)``).
    Exact, but while ``n`` is short of the horizon ``1 / (1 - decay)`` it is
    close to the uniform mean of every sample, the first poor ones included.
  - None: ``average <- decay * average + (1 - decay) * params`` from the run's
    first params, which keep weight ``decay**n`` (0.95 after 50 samples at
    0.999): useless in a run shorter than the horizon.

  Why warm-up is the default: ``purax train --ema-decay 0.999 --steps 200``
  (``tests/app/test_cli.py``) ends with ``eval/accuracy`` 0.9722 and
  ``eval_ema/accuracy`` 0.9722 with it, 0.9611 debiased, 0.4389 plain.

  The average is float32 (bfloat16 params are averaged in float32) and
  follows the params' shardings (the jitted update propagates them; a
  restored average comes replicated on the plan's mesh from
  ``restore_or_init(plan=...)``); one jitted update per sample (no host sync).
  With ``every = k`` the effective horizon is ``k / (1 - decay)`` steps.

  Read it with :attr:`params`; evaluate it with :meth:`state_with_average`,
  or at every evaluation of the run with ``evaluate`` (``eval_ema/*`` next to
  ``eval/*``, when a sample falls on it: ``EMA(decay=0.99, evaluate=lambda s:
  purax.evaluate(task, s, test))``).

  Example:
    >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
    ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
    >>> ema = purax.hooks.EMA(decay=0.99, every=1)
    >>> state = task.init(jax.random.key(0), batch)
    >>> state, _ = purax.fit(task, state, batches, steps=20, hooks=[ema])
    >>> metrics = purax.evaluate(task, ema.state_with_average(state), test)
    >>> metrics['examples']
    64.0

  With a task whose evaluation params are not its params
  (``purax.Task(eval_params=...)``: schedule-free), average what is evaluated
  with ``params_of=task.evaluation_params``, and evaluate the average with
  the task without ``eval_params`` (the average *is* evaluation params; in a
  run: ``evaluate=lambda s: purax.evaluate(plain, s, test)``):

    >>> import dataclasses
    >>> from purax.core.optimizers import schedule_free_eval_params
    >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
    ...                   tx=optax.contrib.schedule_free_adamw(1e-3),
    ...                   eval_params=schedule_free_eval_params)
    >>> ema = purax.hooks.EMA(decay=0.99, every=1, params_of=task.evaluation_params)
    >>> state = task.init(jax.random.key(0), batch)
    >>> state, _ = purax.fit(task, state, batches, steps=4, hooks=[ema])
    >>> plain = dataclasses.replace(task, eval_params=None)
    >>> purax.evaluate(plain, ema.state_with_average(state), test)['examples']
    64.0

  A resumed run restores the average with the state
  (``purax.restore_or_init(..., hooks=[ema])`` then ``fit(restored, ...,
  hooks=[ema])``). Works on a :class:`TrainState` (one device or sharded)
  and on a :class:`purax.core.population.Population` (per-member averages of
  the stacked params).

  Attributes:
    decay: in ``[0, 1)``.
    every: sample every this many steps (>= 1), or 0: after every evaluation.
    correction: ``'warmup'`` (default), ``'debias'`` or None (above).
    at_end: also sample at the last step off the cadence (default False:
      the last step is sampled when it falls on the cadence, so a run
      trained longer later continues the same average).
    evaluate: optional ``state -> {name: number}`` (e.g. :func:`purax.evaluate`
      over the eval batches, with the run's ``plan``): called on the state
      with the average at each sample that falls on an evaluation of the run
      (``eval/*`` in the record); its numbers are written as ``eval_ema/*``.
      Costs one evaluation pass each time.
    params_of: ``state -> params``: what is averaged (a population's
      members' each); default the state's params. E.g.
      ``task.evaluation_params``.
    arrays: ``{'params': float32 params-shaped tree, 'count': int32 []}``
      (samples taken); set by ``fit``.

  Raises:
    ConfigError: ``decay`` outside ``[0, 1)``, ``every < 0`` or an unknown
      ``correction``.
  """

  decay: float = 0.999
  every: int = 1
  correction: str | None = 'warmup'
  at_end: bool = False
  name: str = 'ema'
  evaluate: Any = None
  params_of: Any = None
  arrays: Any = None
  sampled_step: Any = dataclasses.field(default=None, init=False, repr=False)

  def __post_init__(self):
    expect(0.0 <= self.decay < 1.0, 'EMA.decay', 'in [0, 1)', self.decay, ConfigError)
    expect(isinstance(self.every, int) and self.every >= 0, 'EMA.every',
           'an integer >= 0', self.every, ConfigError)
    expect(self.correction in CORRECTIONS, 'EMA.correction', f'one of {CORRECTIONS}',
           repr(self.correction), ConfigError)
    expect(self.params_of is None or callable(self.params_of), 'EMA.params_of',
           'None or a function state -> params', type(self.params_of).__name__, ConfigError)

  def sampled(self, state):
    """The params this hook averages: ``params_of(state)`` (per member of a
    population), or the state's params."""
    return _params_of(state) if self.params_of is None else _sample(self.params_of, state)

  def init_arrays(self, state) -> dict:
    """The average at the start of a run: a float32 copy of the params (traceable;
    a debiased average gives it no weight)."""
    params = self.sampled(state)
    return {'params': jax.tree.map(lambda p: jnp.array(p, _average_dtype(p), copy=True),
                                   params),
            'count': jnp.zeros((), jnp.int32)}

  def __call__(self, info):
    if info.first == info.step or (info.forced and not (
        self.at_end and info.end.done and self.sampled_step != info.step)):
      return None
    state = info.state
    self.sampled_step = info.step
    params = self.sampled(state)
    arrays = self.arrays if self.arrays is not None else self.init_arrays(state)
    self.arrays = _ema_update(arrays, params, jnp.float32(self.decay), self.correction)
    if self.evaluate is None or not info.evaluated:
      return None
    return Output(metrics={f'eval_ema/{k}': v for k, v in
                           self.evaluate(self.state_with_average(state)).items()})

  @property
  def params(self):
    """The averaged params (float32), or None before ``fit`` ran."""
    return None if self.arrays is None else self.arrays['params']

  def state_with_average(self, state):
    """``state`` with its params replaced by the average, cast to the params'
    dtypes: what :func:`purax.evaluate` or ``task.predict`` take."""
    expect(self.arrays is not None, 'EMA.arrays', 'an average (run fit with this hook first)',
           None, ConfigError)
    params = jax.tree.map(lambda a, p: a.astype(p.dtype), self.params, _params_of(state))
    return _with_params(state, params)


def _path_name(path) -> str:
  """``'Dense_0/kernel'`` for the key path of a params leaf."""
  parts = []
  for k in path:
    parts.append(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))))
  return '/'.join(parts)


@functools.lru_cache(maxsize=8)
def _gradients_fn(task):
  """The gradients the step would apply to ``batch`` (unscaled; one compile per task)."""
  return jax.jit(lambda state, batch: task.gradients(state, batch)[0])


@dataclasses.dataclass
class Histograms:
  """Per-layer parameter histograms and gradient norms at log points, through
  the writer's ``write_histograms`` (TensorBoard's Histograms tab; writers
  without it ignore them).

  At each call, for a :class:`TrainState`:

  - ``params/<layer>/<name>``: the histogram of each params leaf's values;
  - with ``task`` and ``batch`` given: ``grads/<layer>/<name>``, the
    histogram of each leaf's gradient on ``batch``, the scalars
    ``grad_norm/<layer>`` (the L2 norm over the layer's leaves) and the
    histogram ``grad_norm`` of those per-layer norms.

  Gradients: the state holds none (the step does not keep them: that would
  cost a params-sized buffer every step), so they are computed here, at the
  current params, on the fixed ``batch`` you pass (e.g. the first training
  batch): the gradients ``task.step`` would apply to it
  (:meth:`purax.Task.gradients`: microbatches, loss scale removed), with the
  step's dropout key.
  Cost per call: one forward and backward pass of ``batch`` (one extra
  compilation in the run) and a host copy of the params and gradients — run
  it every few hundred steps, not every step.

  One process reads the arrays (``jax.device_get``): on a multi-host mesh the
  params must be addressable by process 0 (not checked here).

  Attributes:
    every: steps between calls (>= 1; put it on the log cadence).
    task, batch: both or neither: the gradient histograms.
    at_end: also run at the last step off the cadence.

  Raises:
    ConfigError: ``every < 1``, or only one of ``task`` and ``batch``.
  """

  every: int = 100
  task: Any = None
  batch: Any = None
  at_end: bool = False
  name: str = 'histograms'

  def __post_init__(self):
    expect(isinstance(self.every, int) and self.every >= 1, 'Histograms.every',
           'an integer >= 1', self.every, ConfigError)
    expect((self.task is None) == (self.batch is None), 'Histograms.task/batch',
           'both (gradient histograms) or neither', 'only '
           + ('task' if self.batch is None else 'batch'), ConfigError)

  def __call__(self, info):
    if info.forced and not (self.at_end and info.end.done):
      return None
    state = info.state
    expect(not pop_lib.is_population(state), 'Histograms state',
           'a TrainState (one run)', 'a Population', ConfigError)
    histograms = {f'params/{_path_name(path)}': np.asarray(x, np.float32) for path, x in
                  jax.tree_util.tree_flatten_with_path(jax.device_get(state.params))[0]}
    numbers = {}
    if self.task is not None:
      grads = jax.device_get(_gradients_fn(self.task)(state, self.batch))
      squares = {}
      for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        g = np.asarray(g, np.float32)
        histograms[f'grads/{_path_name(path)}'] = g
        layer = _path_name(path[:-1]) or _path_name(path)
        squares[layer] = squares.get(layer, 0.0) + float(np.sum(np.square(g, dtype=np.float64)))
      norms = {layer: math.sqrt(s) for layer, s in squares.items()}
      numbers.update({f'grad_norm/{layer}': n for layer, n in norms.items()})
      histograms['grad_norm'] = np.asarray(list(norms.values()), np.float32)
    return Output(metrics=numbers, histograms=histograms)
