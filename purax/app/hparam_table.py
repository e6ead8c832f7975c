"""The hyperparameter table: one row per tunable hyperparameter of the CLI.

A row says everything the application layer needs to know about it: its
config field (``--FIELD``, and a short alias such as ``--lr``), its default,
and its name in the state (its bounds are the core's one table,
:data:`purax.core.bounds.BOUNDS`, checked here for ``purax train`` values and
``purax sweep`` specs, and clipped to by PBT) — an optimizer
hyperparameter lives in ``opt_state.hyperparams`` (injected by
:func:`purax.core.optim.adamw`), a loss one in ``state.hparams``.

The config sections :class:`OptimizerConfig` (values, ``purax train``) and
:class:`OptimizerSearch` (search specs, ``purax sweep``) are generated from
:data:`HPARAMS`, as are the sweep report's columns and the plot legends; both
also name the optimizer (``--optimizer``, a row of
:data:`purax.app.optimizer_table.OPTIMIZERS`, which says which rows it takes) and
its weight-decay mask. So a new sweepable optimizer hyperparameter is one row
here plus its argument in the builders that take it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Literal

import tyro

from purax.app.fields import field
from purax.app.optimizer_table import OPTIMIZERS, SCHEDULE_ROWS, WEIGHT_DECAY_MASKS
from purax.core import bounds as bounds_lib
from purax.core import lazy
from purax.core.bounds import Bounds
from purax.core.errors import ConfigError, expect

# Parses specs when a config is checked (its draws need jax): imported on use.
search = lazy.module('purax.app.search')
spikes = lazy.module('purax.core.spikes')


@dataclasses.dataclass(frozen=True)
class HParam:
  """One hyperparameter.

  Attributes:
    field: config field and ``--flag`` (``learning_rate`` -> ``--learning-rate``).
    state: its name in the state (``opt_state.hyperparams`` or ``state.hparams``).
    where: ``'optimizer'`` (an argument of the optimizers of
      :data:`purax.app.optimizer_table.OPTIMIZERS` that list it) or ``'loss'`` (a
      key of ``Task.hparams``).
    default: the value when not given.
    short: a shorter flag and the column / legend name (``lr``).
    help: one line for ``--help``.
    unset: the default is outside the bounds and means "unset" (a schedule
      row: its value is derived, :func:`schedule_values`).
  """

  field: str
  state: str
  where: Literal['optimizer', 'loss']
  default: float
  short: str | None = None
  help: str = ''
  unset: bool = False

  @property
  def label(self) -> str:
    return self.short or self.field

  @property
  def bounds(self) -> Bounds:
    """Its valid interval: :data:`purax.core.bounds.BOUNDS`, the one table."""
    return bounds_lib.bounds(self.state)

  def interval(self) -> str:
    return self.bounds.interval()

  def contains(self, value: float) -> bool:
    return self.bounds.contains(value)

  def check(self, value: float, name: str | None = None) -> None:
    """Raises ConfigError naming ``name`` (default the field) unless in bounds."""
    self.bounds.check(value, name or self.field)

  def clip_bounds(self) -> tuple[float, float]:
    """The closed float32 interval PBT clips a perturbed value to."""
    return self.bounds.clip()


#: The one hyperparameter table: one :class:`HParam` row per tunable
#: hyperparameter (its flag, state name, default, bounds and short flag).
HPARAMS: tuple[HParam, ...] = (
    HParam('learning_rate', 'learning_rate', 'optimizer', 2e-3,
           short='lr', help='peak learning rate (after warmup; then the optimizer\'s schedule)'),
    HParam('weight_decay', 'weight_decay', 'optimizer', 1e-4, short='wd',
           help='decoupled weight decay'),
    HParam('b1', 'b1', 'optimizer', 0.9, help="Adam's first-moment decay rate"),
    HParam('b2', 'b2', 'optimizer', 0.999, help="Adam's second-moment decay rate"),
    HParam('clip_norm', 'clip_norm', 'optimizer', 1.0, short='clip',
           help='global-norm gradient clipping threshold'),
    HParam('momentum', 'momentum', 'optimizer', 0.9,
           help='momentum of sgd and muon (Muon\'s authors use 0.95)'),
    HParam('label_smoothing', 'label_smoothing', 'loss', 0.0,
           short='ls', help='label smoothing of the classification / LM loss'),
    HParam('decay_start', 'decay_start', 'optimizer', -1.0, unset=True,
           help='--schedule wsd: the step its cooldown starts (unset: --steps minus '
           '--cooldown-steps; sweep --from: the branch step)'),
    HParam('cooldown_steps', 'cooldown_steps', 'optimizer', 0.0, unset=True,
           help='--schedule wsd: the cooldown\'s length (steps), a 1-sqrt decay to 0 '
           '(Hägele et al. 2024; unset: 20% of --steps)'),
)

BY_FIELD = {h.field: h for h in HPARAMS}
BY_STATE = {h.state: h for h in HPARAMS}


def order(name: str) -> tuple[int, str]:
  """A sort key: the table's rows (by state name) in table order, then other names."""
  rows = [h.state for h in HPARAMS]
  return (rows.index(name), '') if name in rows else (len(rows), name)


def label(state_name: str) -> str:
  """The short column / legend name of a state hyperparameter (its own name
  when it is not in the table, e.g. a user's loss hyperparameter)."""
  row = BY_STATE.get(state_name)
  return row.label if row else state_name


# -- the config sections generated from the table ------------------------------

#: Fields of the optimizer section that are not tunable hyperparameters.
_CHOICES = (
    ('name', Annotated[Literal[tuple(OPTIMIZERS)], tyro.conf.arg(
        name='optimizer', help='the optimizer (a row of purax.app.optimizer_table.OPTIMIZERS): '
        + '; '.join(f'{k}: {v.help}' for k, v in OPTIMIZERS.items()))], 'adamw'),
    ('weight_decay_mask', Annotated[Literal[tuple(WEIGHT_DECAY_MASKS)], tyro.conf.arg(
        help='which leaves weight decay applies to: matrices (ndim >= 2: no bias or norm '
        'scale; nanoGPT / MaxText) or all (purax before 0.2; runs saved before the option '
        'resume with it)')], 'matrices'),
    ('schedule', Annotated[Literal[('default', *SCHEDULE_ROWS)], tyro.conf.arg(
        help='the learning-rate schedule: default (the optimizer\'s own: cosine for adamw) '
        'or wsd (warmup, constant, then a 1-sqrt cooldown of --cooldown-steps from '
        '--decay-start; adamw only)')], 'default'),
)

_SETTINGS = (
    ('warmup_steps', int, 50, 'linear warmup length (steps)'),
    ('microbatches', int, 1, 'gradient accumulation: split each batch into N microbatches '
     '(batch_size must divide); one optimizer update per batch'),
    ('loss_scale', float, 2.0 ** 15, 'initial dynamic loss scale when the precision computes '
     'in float16'),
    ('max_consecutive_skips', int, 10, 'stop with an error after N consecutive steps with '
     'non-finite gradients (each is skipped, the state unchanged)'),
    ('spike_k', float, 0.0, 'loss-spike guard: skip an update whose loss or gradient norm '
     'exceeds the mean of the last --spike-window steps plus K standard deviations (e.g. 6; '
     'counted as train/spikes; 0: off)'),
    ('spike_window', int, 128, 'steps of history the loss-spike guard compares with (in '
     '[2, 2**24]; its state is 8 bytes a step, per sweep member, checked against the memory)'),
    ('spike_rollback', int, 0, 'on a spike (--spike-k), restore the state of STEPS steps back '
     'from a ring of host snapshots and go on as --spike-action says (an event in '
     'metrics.jsonl and the checkpoint; 0: off, spikes are only skipped)'),
    ('spike_action', str, 'skip-data', 'after a rollback: skip-data (skip the data steps rolled '
     'back) or lower-lr (replay them with the rate scaled by --spike-lr-scale)'),
    ('spike_lr_scale', float, 0.1, 'lower-lr: the factor of the learning rate after a rollback, '
     'in (0, 1]'),
    ('spike_lr_steps', int, 0, 'lower-lr: steps with the lowered rate (0: --spike-rollback)'),
    ('z_loss', float, 0.0, 'language models: add Z_LOSS * log(Z)**2 to each token\'s loss, '
     'Z the softmax normalizer (PaLM used 1e-4; 0: off)'),
)

_SETTING_CHECKS = {
    'warmup_steps': (lambda v: v >= 0, '>= 0'),
    'microbatches': (lambda v: v >= 1, '>= 1'),
    'loss_scale': (lambda v: math.isfinite(v) and 1 <= v <= 2.0 ** 24, 'in [1, 2**24]'),
    'max_consecutive_skips': (lambda v: v >= 1, '>= 1'),
    'spike_k': (lambda v: math.isfinite(v) and v >= 0, 'a finite number >= 0 (0: off)'),
    'z_loss': (lambda v: math.isfinite(v) and v >= 0, 'a finite number >= 0 (0: off)'),
    'spike_rollback': (lambda v: v >= 0, '>= 0 (0: off)'),
    'spike_action': (lambda v: v in ('skip-data', 'lower-lr'), "'skip-data' or 'lower-lr'"),
    'spike_lr_scale': (lambda v: math.isfinite(v) and 0 < v <= 1, 'a number in (0, 1]'),
    'spike_lr_steps': (lambda v: v >= 0, '>= 0 (0: --spike-rollback)'),
}


#: Names of the optimizer section's settings (not tunable hyperparameters).
SETTINGS = tuple(name for name, *_ in _CHOICES + _SETTINGS)

#: The settings of a spike rollback (``--spike-rollback``, what it does after
#: one) and their defaults: the settings a single run's host-side rollback
#: reads, and a population has none (:func:`purax.app.config.refuse_rollback`).
ROLLBACK_DEFAULTS = {name: default for name, _, default, _ in _SETTINGS
                     if name.startswith(('spike_rollback', 'spike_action', 'spike_lr_'))}


def _flag(row: HParam, kind, default, help_text):
  aliases = (f'--{row.short}',) if row.short else ()
  return (row.field, Annotated[kind, tyro.conf.arg(help=help_text, aliases=aliases)],
          dataclasses.field(default=default))


def _settings():
  return [(name, kind, field(default)) for name, kind, default in _CHOICES] + [
      (name, Annotated[kind, tyro.conf.arg(help=text)],
       field(default, resumable=name == 'max_consecutive_skips'))
      for name, kind, default, text in _SETTINGS]


def takes(optimizer: str, row: HParam, schedule: str = 'default') -> bool:
  """Whether ``row`` applies under ``--optimizer optimizer`` and ``--schedule
  schedule`` (a loss row always does; a schedule's row under it only)."""
  for name, rows in SCHEDULE_ROWS.items():
    if row.state in rows:
      return schedule == name and name in OPTIMIZERS[optimizer].schedules
  return row.where == 'loss' or row.state in OPTIMIZERS[optimizer].hparams


def schedule_values(values: dict, steps: int) -> dict:
  """``values`` (state names) with an unset schedule row given its meaning:
  ``cooldown_steps`` 20% of ``steps`` (at least 1), ``decay_start`` ``steps``
  minus the cooldown (at least 0)."""
  out = dict(values)
  if out.get('cooldown_steps') == BY_STATE['cooldown_steps'].default:
    out['cooldown_steps'] = float(max(1, round(0.2 * steps)))
  if out.get('decay_start') == BY_STATE['decay_start'].default:
    out['decay_start'] = float(max(steps - out.get('cooldown_steps', 0.0), 0))
  return out


def _check_optimizer(self) -> None:
  expect(self.name in OPTIMIZERS, 'optimizer', f'one of {sorted(OPTIMIZERS)}', repr(self.name),
         ConfigError)
  expect(self.weight_decay_mask in WEIGHT_DECAY_MASKS, 'weight_decay_mask',
         f'one of {sorted(WEIGHT_DECAY_MASKS)}', repr(self.weight_decay_mask), ConfigError)
  expect(self.schedule == 'default' or self.schedule in OPTIMIZERS[self.name].schedules,
         'schedule', f"'default' or one of {list(OPTIMIZERS[self.name].schedules)} for "
         f'--optimizer {self.name}', repr(self.schedule), ConfigError)
  for row in HPARAMS:
    value = getattr(self, row.field)
    default = row.default if isinstance(value, (int, float)) else repr(row.default)
    taken = takes(self.name, row, self.schedule)
    expect(taken or value == default, row.field,
           f'unset for --optimizer {self.name}'
           + (f' --schedule {self.schedule}' if self.schedule != 'default' else '')
           + f' (its hyperparameters: '
           f'{", ".join(r.field for r in HPARAMS if takes(self.name, r, self.schedule))})',
           repr(value), ConfigError)
    if row.unset and value == default:
      continue
    if isinstance(value, (int, float)):
      row.check(value)
    else:
      parse_spec(row, value)
  for name, (ok, expected) in _SETTING_CHECKS.items():
    expect(ok(getattr(self, name)), name, expected, getattr(self, name), ConfigError)
  expect(not self.spike_rollback or self.spike_k > 0, 'spike_rollback',
         '0 without the spike guard (--spike-k K > 0: the rollback acts on its spikes)',
         self.spike_rollback, ConfigError)
  lowered = bool(self.spike_rollback) and self.spike_action == 'lower-lr'
  for name, when, what in (('spike_action', bool(self.spike_rollback), 'it says what a '
                            'rollback does'),
                           ('spike_lr_scale', lowered, 'the rate of a lowered replay'),
                           ('spike_lr_steps', lowered, 'the steps of a lowered replay')):
    value, default = getattr(self, name), ROLLBACK_DEFAULTS[name]
    expect(when or value == default, name, f'{default!r} (the default) unless --spike-rollback '
           f'is set{"" if name == "spike_action" else " with --spike-action lower-lr"} ({what})',
           repr(value), ConfigError)
  window = self.spike_window      # a sanity bound; the memory: config.check_spike_window
  expect(2 <= window <= spikes.MAX_WINDOW, 'spike_window',
         f'an integer in [2, 2**24 = {spikes.MAX_WINDOW}] (steps of history)',
         f'{window}' + (f', whose state would need {spikes.window_bytes(window) / 2 ** 30:.2f} '
                        'GiB per member' if window > spikes.MAX_WINDOW else ''), ConfigError)


def _values(self) -> dict[str, float]:
  """``state name -> value`` of every hyperparameter (the optimizer's / ``Task.hparams``)."""
  return {row.state: float(getattr(self, row.field)) for row in HPARAMS}


OptimizerConfig = dataclasses.make_dataclass(
    'OptimizerConfig',
    [_flag(r, float, r.default, r.help) for r in HPARAMS] + _settings(),
    frozen=True, namespace={'validate': _check_optimizer, 'values': _values,
                            '__doc__': 'The optimizer (a row of OPTIMIZERS; AdamW by '
                            'default) and the loss hyperparameters: one field per row of '
                            'HPARAMS, plus the update settings.'})

OptimizerSearch = dataclasses.make_dataclass(
    'OptimizerSearch',
    [_flag(r, str, repr(r.default), f"{r.help}: 'v1,v2,...', 'loguniform:LOW:HIGH' or "
           f"'uniform:LOW:HIGH', values in {r.interval()}") for r in HPARAMS] + _settings(),
    frozen=True, namespace={'validate': _check_optimizer,
                            '__doc__': 'The optimizer section of a sweep: each hyperparameter '
                            'a search spec (a list, or a distribution drawn per member).'})


def parse_spec(row: HParam, text: str):
  """Parses a sweep spec of ``row``: ``a,b,c``, ``loguniform:lo:hi`` or ``uniform:lo:hi``.

  Returns:
    A tuple of floats, or a :class:`purax.app.search.Uniform`.

  Raises:
    ConfigError: a malformed spec or a value outside the row's bounds,
      naming ``--FIELD``, the expected form and the text given.
  """
  if row.unset and text == repr(row.default):
    return (row.default,)         # unset: derived (SweepConfig.specs, schedule_values)
  spec = search.parse_spec(row.field.replace("_", "-"), text)
  values = spec if isinstance(spec, tuple) else (spec.low, spec.high)
  expect(all(row.contains(v) for v in values), f'--{row.field.replace("_", "-")}',
         f'values in {row.interval()}', repr(text), ConfigError)
  return spec
