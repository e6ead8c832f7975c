"""The learning-rate range test, every rate of the grid in one compiled program.

The range test (Smith 2017, "Cyclical Learning Rates for Training Neural
Networks", sec. 3.3) trains briefly at many learning rates and reads a good
one off the curve of loss against rate; fastai's ``lr_find`` and Lightning's
``Tuner.lr_find`` run it as one run whose rate grows step by step. purax runs
each rate of a log-spaced grid as its own short training run, all at once:
the members of a :class:`purax.core.population.Population` start from the
same state and differ only in their peak learning rate (a float32 leaf of the
state), and :func:`purax.core.population.step` — each member's
:meth:`purax.Task.step`, vmapped (or chunked, ``strategy``), jitted as
``purax.plan.members.train_step`` — trains them in one compiled program, which a
second grid of the same size reuses. Member ``i`` computes what a run with
rate ``i`` alone computes (bitwise on the CPU under ``strategy='auto'``); a
member whose update goes non-finite is frozen and counts as diverged. The
task's schedule applies to every member: the suggestion is a peak rate for
the task's warmup and decay.

Each member's curve point is its smoothed loss: the mean of its training loss
over the last ``window`` steps of the budget (a quarter by default). A member
diverged when a loss of it is non-finite (its update went non-finite and it
was frozen) or when its point ends above :data:`DIVERGED_ABOVE` (2) times its
first loss (the loss of the shared initial state); its point is then
``+inf``, and no rule suggests it. A rule then suggests a rate (:data:`RULES`):

- ``'lowest'`` (default): the rate of least smoothed loss. Each member is
  an independent run trained for the whole budget, so its point is the
  outcome of training at that rate for that budget, and the best of them is
  the rate to take: the grid search of Bergstra and Bengio (2012, "Random
  Search for Hyper-Parameter Optimization", sec. 1) read on the training
  loss. Chosen over the others on outcome: trained at the suggestion for
  the test's budget and for three times longer, it reached an eval loss
  within 10% of the grid's best on more of the bundled models and data sets
  than any other rule, ``'steepest'`` on none (``benchmarks/lr_range_outcome.py``;
  its table, and the rows where it missed and why, in ``benchmarks/README.md``).
  Its limits: a training loss ranks rates close to the best by noise, and
  the best rate of a longer run can be lower than that of the test's.
- ``'largest_within'``: the largest rate whose point is within
  :data:`WITHIN` (10%) of the least: the "largest stable rate" practice
  (Smith 2018, "A disciplined approach to neural network hyper-parameters",
  sec. 4.1: the largest rate that still trains well regularises), bounded
  by the loss the test measured.
- ``'steepest'``: the rate where the smoothed loss falls fastest as the
  rate grows — the most negative slope of loss against ``log10(lr)``
  (``np.gradient``: central differences) among the rates below the one of
  least loss (the first rate when fewer than two lie below it). This is
  Lightning's ``Tuner.lr_find`` suggestion and fastai's ``steep``, made
  for the single-run range test (Smith 2017), whose one run raises the rate
  step by step so that its curve mixes rate and time; on independent runs
  it suggests a rate well below the best (kept for comparison).
- ``'minimum'``: one tenth of the rate of least smoothed loss (fastai's
  ``minimum``, "Minimum/10", also made for the single run).

A test that measured nothing usable raises :class:`RangeTestError` (a
:class:`purax.ConfigError`) saying what to change: fewer than
:data:`MIN_STEPS` (8) steps (the window would hold losses taken after
almost no updates: raise ``steps``); fewer than two rates left once the
diverged are (lower the grid); or a flat curve, whose usable points span
less than :data:`FLAT` (1%) of the first loss (nothing the rates did
differs: widen the grid or train longer), or whose least point is not 1%
below the first loss (no rate trained: move the grid).

Weight decay has no population rule here, and why not: a short test reads
the training loss, which weight decay raises by construction (it pulls the
weights off the training loss's minimum), so a rule on it picks the least
decay of any grid; its benefit is on held-out loss at the full budget, and
in AdamW its strength per step is the product of the rate and the decay
(Loshchilov and Hutter 2019, "Decoupled Weight Decay Regularization",
sec. 2), so a decay grid at one rate answers a question of that rate
only. Compare decays with ``purax sweep`` (``--weight-decay`` values, the
full budget, judged by the eval loss) at a rate this test suggested.

Batch size has no population rule here, and why not: the members of one
program share its shapes, so a batch-size population pads every member to
the largest batch (with weight 0 on the padding, which purax makes exact)
and each member costs the largest batch's compute, so nothing is saved
against separate runs; at a fixed number of steps the larger batches see
more data and win by construction, and at a fixed number of examples the
members would need different step counts, which lockstep members cannot
take; and the best rate moves with the batch size (Goyal et al. 2017,
"Accurate, Large Minibatch SGD"), so batch sizes compare only each at its own
tuned rate. The batch-size question is answered by the gradient noise scale
(McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"),
measured from gradient norms at two batch sizes, then a range test at the
chosen size.

Example: four rates, ten steps each, in one program:

  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=10, warmup_steps=0))
  >>> state = jax.jit(task.init)(jax.random.key(0), batches[0])
  >>> lrs = purax.tune.log_grid(1e-3, 1.0, 4)
  >>> [float(f'{lr:.3g}') for lr in lrs]
  [0.001, 0.01, 0.1, 1.0]
  >>> result = purax.tune.lr_range_test(task, state, batches, lrs=lrs, steps=10,
  ...                                   strategy='vmap')
  >>> result.losses.shape                # [steps, rates]
  (10, 4)
  >>> result.rule, bool(np.isclose(lrs, result.suggestion).any())   # a rate of the grid
  ('lowest', True)
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterable

import jax
import numpy as np

from purax.core import hparams as hparams_lib
from purax.core import metrics as metrics_lib
from purax.core import population as pop_lib
from purax.core.errors import ConfigError, DataError, expect, expect_kind
from purax.core.state import TrainState
from purax.core.task import Task
from purax.plan.feed import host_batch_transfer
from purax.tune.lr_rules import DEFAULT_RULE, DIVERGED_ABOVE, FLAT, MIN_STEPS, WITHIN
from purax.tune.lr_rules import RULES as RULES
from purax.tune.lr_rules import Rule as Rule


class RangeTestError(ConfigError):
  """A range test measured nothing a rule can read (module doc): too few
  steps, every rate but one diverged, or a flat curve; the message says what
  to change (``--steps``, ``--min-lr``/``--max-lr``)."""


def log_grid(min_lr: float = 1e-5, max_lr: float = 1.0, num: int = 16) -> np.ndarray:
  """``num`` learning rates from ``min_lr`` to ``max_lr``, evenly spaced in
  ``log10``, float32 ``[num]``.

  Raises:
    ConfigError: not ``0 < min_lr < max_lr``, or ``num < 2``.
  """
  expect(0 < min_lr < max_lr, 'min_lr, max_lr', '0 < min_lr < max_lr',
         f'{min_lr}, {max_lr}', ConfigError)
  expect(isinstance(num, (int, np.integer)) and num >= 2, 'num', 'an integer >= 2', num,
         ConfigError)
  return np.geomspace(min_lr, max_lr, int(num)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class LRRange:
  """What :func:`lr_range_test` found.

  Attributes:
    lrs: float32 ``[members]``, the grid, ascending.
    losses: float64 ``[steps, members]``: each member's training loss per
      step; NaN from the step a member diverged.
    smoothed: float64 ``[members]``: the mean loss over the last
      ``window`` steps; ``+inf`` for a member that diverged.
    diverged: bool ``[members]``.
    window: the steps ``smoothed`` averages.
    rule: the rule of ``suggestion``.
    suggestion: the suggested learning rate.
  """

  lrs: np.ndarray
  losses: np.ndarray
  smoothed: np.ndarray
  diverged: np.ndarray
  window: int
  rule: str
  suggestion: float

  @classmethod
  def of(cls, lrs, losses, diverged, *, window: int, rule: Rule = DEFAULT_RULE) -> 'LRRange':
    """The curve and the suggestion of per-step losses ``[steps, members]``
    of the rates ``lrs`` (ascending); a member counts as diverged when it is
    flagged in ``diverged`` (``[members]``), a loss of it is non-finite, or
    its point (the mean of its last ``window`` losses) is above
    :data:`DIVERGED_ABOVE` times its first loss. How :func:`lr_range_test`
    ends, and how a sweep of separate runs is read the same way
    (``benchmarks/lr_range.py``).

    Raises:
      RangeTestError: fewer than :data:`MIN_STEPS` steps, fewer than two
        rates left once the diverged are, or a flat curve (:func:`suggest`).
    """
    lrs, losses = np.asarray(lrs, np.float32), np.asarray(losses, np.float64)
    expect(len(losses) >= MIN_STEPS, 'steps', f'at least {MIN_STEPS} steps for a range test '
           'to tell the rates apart (raise --steps)', len(losses), RangeTestError)
    points = losses[-window:].mean(axis=0)      # the last steps: what each rate ended at
    with np.errstate(invalid='ignore'):
      rose = ~(points <= DIVERGED_ABOVE * losses[0])
    diverged = np.asarray(diverged, bool) | ~np.isfinite(losses).all(axis=0) | rose
    smoothed = np.where(diverged, np.inf, points)
    first = float(np.nanmax(np.abs(losses[0]))) if np.isfinite(losses[0]).any() else None
    return cls(lrs, losses, smoothed, diverged, int(window), rule,
               suggest(lrs, smoothed, rule, first_loss=first))

  def suggest(self, rule: Rule) -> float:
    """The learning rate ``rule`` suggests from this curve (:func:`suggest`)."""
    return suggest(self.lrs, self.smoothed, rule)

  def as_dict(self) -> dict[str, Any]:
    """JSON-ready: lists of numbers (non-finite values as strings)."""
    number = lambda v: float(v) if np.isfinite(v) else str(float(v))   # noqa: E731
    return {'lrs': [float(v) for v in self.lrs],
            'smoothed': [number(v) for v in self.smoothed],
            'losses': [[number(v) for v in row] for row in self.losses],
            'diverged': [bool(v) for v in self.diverged], 'window': self.window,
            'rule': self.rule, 'suggestion': self.suggestion}


def suggest(lrs, smoothed, rule: Rule = DEFAULT_RULE, *, first_loss: float | None = None
            ) -> float:
  """The learning rate a rule suggests from a range test's curve (module doc).

  Args:
    lrs: ``[members]`` learning rates, ascending.
    smoothed: ``[members]`` smoothed losses; non-finite: diverged (left out).
    rule: one of :data:`RULES`.
    first_loss: the loss every member started from; when given, a curve
      whose finite points span less than :data:`FLAT` of it is flat, and one
      whose least point is not ``FLAT`` below it trained nothing.

  Raises:
    ConfigError: an unknown rule.
    RangeTestError: fewer than two rates that trained without diverging
      (lower the grid), a flat curve, or no rate that lowered the loss.
  """
  expect(rule in RULES, 'rule', f'one of {list(RULES)}', repr(rule), ConfigError)
  lrs, smoothed = np.asarray(lrs, np.float64), np.asarray(smoothed, np.float64)
  finite = np.isfinite(smoothed)
  expect(int(finite.sum()) >= 2, 'lrs', 'at least two learning rates that train without '
         f'diverging (a loss non-finite, or ending above {DIVERGED_ABOVE:g} times the first); '
         'lower the grid (--min-lr, --max-lr)', f'{int(finite.sum())} of {len(lrs)}',
         RangeTestError)
  x, y = np.log10(lrs[finite]), smoothed[finite]
  if first_loss is not None:
    span = float(y.max() - y.min())
    expect(span >= FLAT * first_loss, 'lrs', f'a curve whose points differ by at least '
           f'{FLAT:.0%} of the first loss {first_loss:.4g} (flat: the rates trained alike); '
           'widen the grid (--min-lr, --max-lr) or train longer (--steps)',
           f'a span of {span:.3g}', RangeTestError)
    expect(y.min() <= (1 - FLAT) * first_loss, 'lrs', f'a rate whose loss ends at least '
           f'{FLAT:.0%} below the first loss {first_loss:.4g} (none trained: the grid is too '
           'high or too low); move the grid (--min-lr, --max-lr) or train longer (--steps)',
           f'a least loss of {y.min():.4g}', RangeTestError)
  best = int(np.argmin(y))
  if rule == 'lowest':
    return float(lrs[finite][best])
  if rule == 'largest_within':
    return float(lrs[finite][np.flatnonzero(y <= y[best] + WITHIN * abs(y[best]))[-1]])
  if rule == 'minimum':
    return float(10 ** x[best] / 10)
  if best <= 1:            # no descent before the minimum: the grid starts too high
    return float(10 ** x[0])
  slopes = np.gradient(y[:best + 1], x[:best + 1])[:best]   # the minimum ends the descent
  return float(10 ** x[int(np.argmin(slopes))])


def population_of(state: TrainState, values: dict[str, np.ndarray]) -> pop_lib.Population:
  """A population whose members are copies of ``state`` but for ``values``
  (name -> ``[members]``, :func:`purax.core.hparams.set`). Assembled on the
  host and put on the device: nothing is compiled."""
  members = len(next(iter(values.values())))

  def stack(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      data = np.asarray(jax.random.key_data(x))
      return jax.random.wrap_key_data(np.broadcast_to(data, (members, *data.shape)).copy(),
                                      impl=jax.random.key_impl(x))
    x = np.asarray(x)
    return np.broadcast_to(x, (members, *x.shape)).copy()

  stacked = hparams_lib.set(jax.tree.map(stack, state), values)
  return jax.device_put(pop_lib.Population(
      state=stacked, diverged=np.zeros(members, bool), stopped=np.zeros(members, bool),
      best=np.full(members, np.inf, np.float32), stale=np.zeros(members, np.int32)))


def lr_range_test(task: Task, state: TrainState, batches: Iterable, *, lrs=None,
                  steps: int = 100, rule: Rule = DEFAULT_RULE, window: int | None = None,
                  hparam: str = 'learning_rate',
                  strategy: pop_lib.Strategy = 'auto') -> LRRange:
  """Trains ``state`` at every learning rate of ``lrs`` at once for ``steps``
  updates, in one compiled program, and suggests a rate (module doc).

  Args:
    task: the task; its schedule applies to every member.
    state: the state every member starts from (e.g. ``task.init(key, batch)``).
    batches: at least ``steps`` batches, shared by every member (a sequence
      or an iterator of ``{'x': [batch, ...], ...}``).
    lrs: ``[members]`` learning rates; default :func:`log_grid`'s 16 from
      1e-5 to 1. Sorted ascending.
    steps: updates per member; at least :data:`MIN_STEPS`.
    rule: one of :data:`RULES` (module doc); default ``'lowest'``.
    window: the last steps whose mean loss is a member's point; default
      ``max(1, steps // 4)``.
    hparam: the state's learning-rate hyperparameter
      (:func:`purax.adamw`'s ``'learning_rate'``, the schedule's peak;
      ``'peak_learning_rate'``, its name before 0.3, with a ``DeprecationWarning``).
    strategy: how members share the machine
      (:func:`purax.core.population.chunk_size`); the values are the same.

  Returns:
    An :class:`LRRange`: the grid, each member's losses, the curve, the suggestion.

  Raises:
    ConfigError: bad ``lrs`` / ``steps`` / ``window`` / ``rule`` / ``hparam``.
    RangeTestError: nothing usable measured (a ``ConfigError``, module doc):
      ``steps`` below :data:`MIN_STEPS` (before anything runs), fewer than
      two rates that trained without diverging, or a flat curve.
    DataError: fewer than ``steps`` batches.
  """
  test = RangeTest(task, state, lrs=lrs, steps=steps, rule=rule, window=window, hparam=hparam,
                   strategy=strategy)
  batches = list(itertools.islice(iter(batches), steps))
  expect(len(batches) == steps, 'batches', f'at least steps={steps} batches', len(batches),
         DataError)
  for batch in batches:     # one program, every call; no host sync until the end
    test.step(batch)
  return test.result()


class RangeTest:
  """:func:`lr_range_test` one step at a time, so that a caller can poll a
  flag between steps and checkpoint (:meth:`tree`) and resume
  (:meth:`restore`) it: a resumed test ends with the same losses, bitwise,
  as one run straight through. The arguments are :func:`lr_range_test`'s
  (and checked alike).

  Attributes:
    lrs: the sorted grid; steps: the budget; done: the steps taken so far;
    end: the step the test ends at (``steps``, or earlier: :meth:`end_at`).
  """

  def __init__(self, task: Task, state: TrainState, *, lrs=None, steps: int = 100,
               rule: Rule = DEFAULT_RULE, window: int | None = None,
               hparam: str = 'learning_rate', strategy: pop_lib.Strategy = 'auto'):
    expect_kind(task, 'task', Task, 'a purax.Task')
    expect_kind(state, 'state', TrainState, 'a purax.TrainState (task.init(key, batch))')
    expect(rule in RULES, 'rule', f'one of {list(RULES)}', repr(rule), ConfigError)
    expect(isinstance(steps, (int, np.integer)) and steps >= 1, 'steps', 'an integer >= 1',
           steps, ConfigError)
    window_given, window = window, max(1, steps // 4) if window is None else window
    expect(isinstance(window, (int, np.integer)) and 1 <= window <= steps, 'window',
           f'an integer in [1, steps={steps}]', window, ConfigError)
    lrs = np.sort(np.asarray(log_grid() if lrs is None else lrs, np.float32).ravel())
    expect(lrs.size >= 2, 'lrs', 'at least two learning rates', lrs.tolist(), ConfigError)
    hparam = hparams_lib.canonical(hparam)
    expect(hparam in hparams_lib.names(state), 'hparam',
           f'one of {list(hparams_lib.names(state))}', repr(hparam), ConfigError)
    hparams_lib.check(hparam, lrs)
    expect(steps >= MIN_STEPS, 'steps', f'at least {MIN_STEPS} steps for a range test to tell '
           'the rates apart (raise --steps)', steps, RangeTestError)
    self.task, self.lrs, self.steps, self.rule, self.window = task, lrs, int(steps), rule, window
    self.strategy, self.done, self.end = strategy, 0, int(steps)
    self._default_window = window_given is None
    self._initial, self._pop = (state, hparam), None   # the population: made at first use
    self._abstract = None
    # Each step's summed loss and count: the steps before a restore on the
    # host, those since on the device (read at the end, or at a checkpoint).
    self._host = {'total': [], 'count': []}
    self._windows: list = []

  @property
  def pop(self):
    """The population of every rate (made from the state at first use: the
    options and batches are checked before any array is)."""
    if self._pop is None:
      state, hparam = self._initial
      self.pop = population_of(state, {hparam: self.lrs})
    return self._pop

  @pop.setter
  def pop(self, value) -> None:
    self._pop, self._initial = value, None

  def end_at(self, step: int) -> None:
    """Ends the test at ``step`` instead of ``steps`` (``purax tune lr
    --time-budget``: the steps its budget holds): :meth:`result` reads the
    curve there, over the last quarter of the steps unless a ``window`` was
    given; :meth:`tree` keeps ``steps`` rows (a checkpoint restores alike).

    Raises:
      RangeTestError: ``step`` below :data:`MIN_STEPS`.
      ConfigError: ``step`` below ``done``, above ``steps``, or below
        the ``window`` given.
    """
    expect(isinstance(step, (int, np.integer)) and self.done <= step <= self.steps, 'step',
           f'an integer in [done={self.done}, steps={self.steps}]', step, ConfigError)
    expect(step >= MIN_STEPS, 'steps', f'at least {MIN_STEPS} steps for a range test to tell '
           'the rates apart (raise --steps)', step, RangeTestError)
    if self._default_window:
      self.window = max(1, int(step) // 4)
    expect(self.window <= step, 'window', f'an integer in [1, steps={step}]', self.window,
           ConfigError)
    self.end = int(step)

  def step(self, batch) -> None:
    """Trains every member one step on ``batch`` (asynchronous: no host sync).

    Raises:
      DataError: all ``end`` steps are done.
    """
    expect(self.done < self.end, 'batches', f'at most steps={self.end} batches',
           self.done + 1, DataError)
    if self._abstract is None:
      self._abstract = jax.eval_shape(
          lambda p, b: pop_lib.step(self.task, p, b, strategy='vmap')[1], self.pop, batch)
    with host_batch_transfer():
      self.pop, acc = pop_lib.train_step(self.task, self.pop,
                                         metrics_lib.zeros_like(self._abstract), batch,
                                         strategy=self.strategy)
    self._windows.append(acc['loss'])
    self.done += 1

  def _losses(self) -> tuple[np.ndarray, np.ndarray]:
    """``(total, count)``, ``[steps done, members]`` each, on the host."""
    for loss in jax.device_get(self._windows):
      self._host['total'].append(np.asarray(loss.total))
      self._host['count'].append(np.asarray(loss.count))
    self._windows = []
    members = len(self.lrs)
    return tuple(np.stack(self._host[k]) if self._host[k] else np.zeros((0, members), np.float32)
                 for k in ('total', 'count'))

  def losses(self) -> np.ndarray:
    """float64 ``[done, members]``: each member's training loss per step so
    far, NaN from the step it was frozen (waits for the steps dispatched)."""
    total, count = self._losses()
    return np.asarray(total, np.float64) / np.where(count > 0, count, np.nan)

  def tree(self) -> dict:
    """The test's state as a checkpoint tree: the population and every step's
    summed loss and count, ``[steps, members]`` (rows past ``done`` zero)."""
    total, count = self._losses()
    pad = lambda x: np.concatenate([x, np.zeros((self.steps - len(x), *x.shape[1:]),  # noqa: E731
                                                x.dtype)])
    return {'population': self.pop, 'loss_total': pad(total), 'loss_count': pad(count)}

  def abstract_tree(self, batch) -> dict:
    """The structure of :meth:`tree` (``jax.ShapeDtypeStruct`` leaves), to
    restore it; ``batch``: a batch of the test (only shapes matter)."""
    shape = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
    members = (self.steps, len(self.lrs))
    loss = jax.eval_shape(lambda p, b: pop_lib.step(self.task, p, b, strategy='vmap')[1],
                          self.pop, batch)['loss']
    return {'population': jax.tree.map(shape, self.pop),
            'loss_total': jax.ShapeDtypeStruct(members, loss.total.dtype),
            'loss_count': jax.ShapeDtypeStruct(members, loss.count.dtype)}

  def restore(self, tree: dict, done: int) -> None:
    """Continues from :meth:`tree` saved after ``done`` steps."""
    expect(0 <= done <= self.steps, 'checkpoint step', f'in [0, {self.steps}]', done,
           ConfigError)
    self.pop, self.done, self._windows = tree['population'], int(done), []
    total, count = (np.asarray(jax.device_get(tree[k]))[:done]
                    for k in ('loss_total', 'loss_count'))
    self._host = {'total': list(total), 'count': list(count)}

  def result(self) -> LRRange:
    """The curve and the suggestion (every step up to ``end`` done).

    Raises:
      DataError: fewer than ``end`` steps were taken;
      RangeTestError: fewer than two rates trained without diverging, or a
        flat curve.
    """
    expect(self.done == self.end, 'batches', f'at least steps={self.end} batches',
           self.done, DataError)
    # A member frozen by a non-finite update counts nothing from that step on
    # (its metrics are zero): its loss is NaN there, and it counts as diverged.
    losses = self.losses()
    return LRRange.of(self.lrs, losses, np.zeros(len(self.lrs), bool), window=self.window,
                      rule=self.rule)
