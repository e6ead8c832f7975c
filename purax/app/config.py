"""The typed config of ``purax train``, in sections.

A :class:`TrainConfig` is four sections, each checked in one place:

- ``model`` (:class:`purax.app.models.ModelConfig`): name, sizes, remat, precision;
- ``data`` (:class:`purax.app.data.DataConfig`): data set, batch sizes, sequence length;
- ``optimizer`` (:class:`purax.app.hparam_table.OptimizerConfig`): the optimizer
  (``--optimizer``, a row of :data:`purax.app.optimizer_table.OPTIMIZERS`) and its
  weight-decay mask, one field per row of the hyperparameter table, plus
  warmup, microbatches, loss scale;
- ``run`` (:class:`RunConfig`): steps, seed, run directory, cadences, mesh,
  multi-host, profiling and logging.

A :class:`purax.app.sweep.SweepConfig` (beside the sweep) is the same
sections with the optimizer's values replaced by search specs, plus the
population's own options.

The command line keeps flat flags (``--model``, ``--dataset``, ``--steps``,
``--learning-rate`` / ``--lr``); ``config.json`` holds the sections under a
format number (:data:`FORMAT`). A ``config.json`` of format 1 (the flat
``TrainConfig`` of purax 0.1) is read by :meth:`Sections.of`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import types
import typing
from typing import Any, Literal

import typeguard

from purax import __version__
from purax.app import fields
from purax.app import hparam_table as hparams_lib
from purax.app.fields import field
from purax.app.data import INT32_LIMIT, DataConfig
from purax.app.models import ModelConfig
from purax.core import lazy
from purax.core.errors import ConfigError, expect
from purax.io.safe_files import check_no_links_out, open_file

# Used by the checks, not by the definitions (the parser reads those): imported on use.
metrics_lib = lazy.module('purax.core.metrics')
precision_lib = lazy.module('purax.core.precision')
profile = lazy.module('purax.io.profile')
writers = lazy.module('purax.io.writers')
mesh_lib = lazy.module('purax.parallel.mesh')
budget = lazy.module('purax.plan.budget')
spikes = lazy.module('purax.core.spikes')
budget_hook = lazy.module('purax.hooks.time_budget')

#: The file of a run directory that holds its config (:func:`read_config`).
CONFIG = 'config.json'
#: The format of ``config.json``: 2 since the sections (1: one flat object).
FORMAT = 2
OptimizerConfig = hparams_lib.OptimizerConfig


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The run.

  Attributes:
    steps: optimizer updates (a finished run resumed with a larger value trains on;
      see --decay-steps).
    seed: seed of initialization, shuffling and dropout.
    decay_steps: steps the cosine learning-rate decay spans; when unset --steps (so
      a run resumed with a larger --steps re-plans its decay from there; set it to
      the old --steps to keep the old schedule, which ends at learning rate 0).
    workdir: run directory, runs/DATASET-MODEL-TIME when unset; an existing
      run directory is resumed from its newest committed checkpoint.
    log_every: write training metrics every N steps (the loop's only host sync).
    eval_every: evaluate on the test split every N steps (0: at the end only).
    progress: show a progress bar (on a terminal; one line per log point otherwise).
    checkpoint_every: also save a checkpoint every N steps (0: by --checkpoint-interval-s,
      and at the end).
    checkpoint_interval_s: save at the first log or eval point at least this many
      seconds after the previous save (orbax's continuous policy; 0: off).
    keep_last: keep the newest N checkpoints.
    keep_best: also keep the best K checkpoints by --best-metric (0: off).
    best_metric: the logged metric that ranks checkpoints (--keep-best) and stops
      training (--patience): eval/accuracy, eval/loss, train/loss, eval_ema/...,
      any name metrics.jsonl holds.
    best_mode: max or min: which way --best-metric is better.
    patience: stop after N checks of --best-metric without improvement (0: off);
      checked at every evaluation for an eval metric, at every log point otherwise.
    steps_per_call: run K steps per dispatch (lax.scan over K stacked batches;
      bitwise the same training; log/eval/checkpoint cadences must be
      multiples of K; one device only), or 'auto': K from the measured step
      time when a second compilation pays for itself (purax.plan.choose_steps_per_call).
    debug_nans: replay every update skipped as non-finite at its step (one host read
      per step, one update per call) and report where its first NaN came from; without
      it the updates that end a log window skipped are replayed (no cost per step).
      Each replayed update is saved for purax debug-nan --workdir DIR --step N.
    mesh: run on a device mesh, e.g. 'data=4,fsdp=2' (axes data, fsdp, tensor;
      one may be -1); the strategy follows the shape (purax.parallel.for_mesh).
    coordinator: multi-host: HOST:PORT of process 0 (jax.distributed), or 'auto'.
    num_processes: multi-host: number of processes.
    process_id: multi-host: this process's index; only process 0 writes logs.
    dry_run: validate, build and compile the step, print the model summary and
      the step's FLOPs and memory, and exit without training or writing.
    fit_memory: before a new run starts, compile the step with each remat policy,
      microbatch count (the batch kept), FSDP layout on --mesh and allowed
      precision, and train with the fastest that fits --memory-budget
      (purax.plan.fit_memory; the choice is recorded in config.json and kept on resume).
    memory_budget: with --fit-memory, the memory per device the step may use,
      e.g. '8GiB' or '512MiB'; when unset the device's memory less 10% (on a CPU:
      the host's available memory less 10%).
    fit_memory_precisions: with --fit-memory, the precision presets it may choose
      among, e.g. 'fp32,bf16' (they change the computation); when unset only --precision.
    profile: 'START:STOP': a jax.profiler trace of those steps in the run
      directory (tensorboard --logdir, xprof, or perfetto_trace.json.gz).
    profile_memory: with --profile, also write a device memory profile
      (memory.prof, pprof) when the trace stops.
    wandb_project: also log to Weights & Biases under this project (offline
      unless WANDB_MODE says otherwise; needs pip install 'purax[wandb]').
    ema_decay: keep an exponential moving average of the params with this decay
      per sample, in (0, 1) (checkpointed; evaluated as eval_ema/* at evaluations).
    ema_every: sample the params for the average every N steps.
    histograms: write per-layer parameter and gradient histograms (TensorBoard)
      every N steps (0: off; costs a forward and backward pass on a fixed batch).
    time_budget: end the run within this wall time of the command, e.g. '60s', '5m',
      '1h': the steps are planned from the measured step time (compilation left out),
      the run ends finished ('time budget') with its final evaluation inside it, and
      verdict.json is written (purax.hooks.TimeBudget); --steps stays the most it trains,
      and the learning-rate decay spans --decay-steps (unset: --steps) unless
      --plan-decay. The budget is each invocation's: a resumed run gets a new one (of
      this length).
    plan_decay: with --time-budget, when --decay-steps is unset: measure the step before
      the run starts and set --decay-steps to the steps the budget holds, so the
      decay ends with the budget (purax.app.calibrate; recorded in config.json, which a
      resumed run keeps; skipped when compiling again would cost more than 10% of
      those steps).
  """

  steps: int = field(500, resumable=True, computation=True)
  seed: int = 0
  decay_steps: int | None = field(None, resumable=True, computation=True)
  workdir: str | None = field(None, resumable=True)
  log_every: int = field(50, resumable=True, cadence=True)
  eval_every: int = field(250, resumable=True, cadence=True)
  progress: bool = field(True, resumable=True)
  checkpoint_every: int = field(0, resumable=True, cadence=True)
  checkpoint_interval_s: float = field(300.0, resumable=True)
  keep_last: int = field(2, resumable=True)
  keep_best: int = field(0, resumable=True)
  best_metric: str = field('eval/accuracy', resumable=True)
  best_mode: Literal['max', 'min'] = field('max', resumable=True)
  patience: int = field(0, resumable=True, computation=True)
  steps_per_call: int | Literal['auto'] = field('auto', resumable=True)
  debug_nans: bool = field(False, resumable=True)
  mesh: str | None = field(None, resumable=True)
  coordinator: str | None = field(None, resumable=True)
  num_processes: int | None = field(None, resumable=True)
  process_id: int | None = field(None, resumable=True)
  dry_run: bool = field(False, resumable=True)
  fit_memory: bool = field(False, resumable=True)
  memory_budget: str | None = field(None, resumable=True)
  fit_memory_precisions: str | None = field(None, resumable=True)
  profile: str | None = field(None, resumable=True)
  profile_memory: bool = field(False, resumable=True)
  wandb_project: str | None = field(None, resumable=True)
  ema_decay: float | None = None
  ema_every: int = field(1, cadence=True)
  histograms: int = field(0, resumable=True, cadence=True)
  time_budget: str | None = field(None, resumable=True)
  plan_decay: bool = field(False, resumable=True)

  def best(self) -> metrics_lib.Best:
    """The rule of --keep-best and --patience (:class:`purax.core.metrics.Best`)."""
    return metrics_lib.Best(self.best_metric, self.best_mode)

  def validate(self) -> 'RunConfig':
    """Raises ConfigError naming the field, the expected and the actual value."""
    for name in ('steps', 'log_every', 'keep_last'):
      value = getattr(self, name)
      expect(1 <= value < INT32_LIMIT, name, '>= 1 and < 2**31', value, ConfigError)
    for name in ('eval_every', 'checkpoint_every', 'keep_best', 'patience'):
      value = getattr(self, name)
      expect(0 <= value < INT32_LIMIT, name, '>= 0 and < 2**31', value, ConfigError)
    expect(re.fullmatch(r'[\w.-]+(/[\w.-]+)+', self.best_metric) is not None, 'best_metric',
           "a logged metric name as metrics.jsonl holds it, e.g. 'eval/loss' or 'train/loss'",
           repr(self.best_metric), ConfigError)
    self.best()     # the one rule checks its mode
    expect(0 <= self.checkpoint_interval_s < float('inf'), 'checkpoint_interval_s',
           '>= 0 and finite', self.checkpoint_interval_s, ConfigError)
    expect(self.decay_steps is None or 1 <= self.decay_steps < INT32_LIMIT, 'decay_steps',
           '>= 1 or unset', self.decay_steps, ConfigError)
    expect(0 <= self.seed < 2 ** 32, 'seed', 'in [0, 2**32)', self.seed, ConfigError)
    expect(self.ema_decay is None or 0 < self.ema_decay < 1, 'ema_decay', 'in (0, 1) or unset',
           self.ema_decay, ConfigError)
    expect(1 <= self.ema_every < INT32_LIMIT, 'ema_every', '>= 1', self.ema_every, ConfigError)
    expect(self.ema_every == 1 or self.ema_decay is not None, 'ema_every',
           '1 unless --ema-decay is set (it is the average\'s cadence)', self.ema_every,
           ConfigError)
    expect(0 <= self.histograms < INT32_LIMIT, 'histograms', '>= 0', self.histograms,
           ConfigError)
    k = self.steps_per_call
    if k != 'auto':
      expect(isinstance(k, int) and 1 <= k < INT32_LIMIT, 'steps_per_call',
             "'auto' or an integer >= 1", k, ConfigError)
      cadences = [n for n in fields.names(RunConfig, fields.CADENCE)
                  if n != 'ema_every' or self.ema_decay is not None]
      for name in cadences:
        expect(getattr(self, name) % k == 0, name, f'a multiple of steps_per_call={k}',
               getattr(self, name), ConfigError)
      expect(k == 1 or self.mesh is None, 'steps_per_call', "1 or 'auto' with --mesh "
             '(multi-step calls run on one device)', k, ConfigError)
    if self.mesh is not None:
      mesh_lib.parse_mesh(self.mesh)
    if self.memory_budget is not None:
      budget.parse_bytes(self.memory_budget, 'memory_budget')
    for spec in self.precisions() or ():
      precision_lib.get_policy(spec)
    for name in ('memory_budget', 'fit_memory_precisions'):
      expect(getattr(self, name) is None or self.fit_memory, name,
             'unset unless --fit-memory is set', repr(getattr(self, name)), ConfigError)
    if self.profile is not None:
      start, stop = profile.parse_range(self.profile)
      expect(stop <= self.steps, 'profile', f'a range of steps within --steps={self.steps}',
             repr(self.profile), ConfigError)
    if self.time_budget is not None:
      budget_hook.parse_duration(self.time_budget, 'time_budget')
      expect(not self.num_processes or self.num_processes == 1, 'time_budget',
             'unset for a multi-host run (each process would plan its own steps)',
             repr(self.time_budget), ConfigError)
    expect(not self.plan_decay or self.time_budget is not None, 'plan_decay',
           'set only with --time-budget', f'{self.plan_decay} (time_budget=None)', ConfigError)
    if self.wandb_project is not None:
      bad = sorted(set(self.wandb_project) & set(WANDB_FORBIDDEN))
      expect(0 < len(self.wandb_project) <= 128 and not bad, 'wandb_project',
             f'a W&B project name (1 to 128 characters, none of {" ".join(WANDB_FORBIDDEN)})',
             repr(self.wandb_project), ConfigError)
      writers.check_wandb('wandb_project')
    return self

  def precisions(self) -> tuple[str, ...] | None:
    """The precisions ``--fit-memory`` may choose among (None: the model's own)."""
    if self.fit_memory_precisions is None:
      return None
    specs = tuple(p.strip() for p in self.fit_memory_precisions.split(','))
    expect(all(specs), 'fit_memory_precisions', "preset names such as 'fp32,bf16'",
           repr(self.fit_memory_precisions), ConfigError)
    return specs


SECTIONS = ('model', 'data', 'optimizer', 'run')


def check_spike_window(optimizer, members: int = 1) -> None:
  """Refuses a loss-spike guard (``--spike-k``) whose window (``--spike-window``),
  one per member, cannot fit in memory: before any state is made
  (:func:`purax.plan.budget.expect_fits`).

  Raises:
    ConfigError: naming ``spike_window``, the memory available and the
      memory needed.
  """
  if not optimizer.spike_k:
    return          # no guard: the window is never allocated
  window = optimizer.spike_window
  budget.expect_fits(members * spikes.window_bytes(window), 'spike_window', window,
                     'a window whose state' + (f' ({members} members)' if members > 1 else ''),
                     how='float32 [window, 2] of loss and gradient norm'
                     + (' per member' if members > 1 else ''),
                     hint='use a smaller --spike-window' + (' or fewer members'
                                                            if members > 1 else ''))

def refuse_rollback(optimizer) -> None:
  """Refuses ``--spike-rollback`` for a population (``purax sweep``, ``purax
  tune lr``): a rollback restores one run's state from its ring of host
  snapshots (:class:`purax.hooks.SpikeRollback`), which a population has not.

  Raises:
    ConfigError: naming ``spike_rollback``.
  """
  expect(not optimizer.spike_rollback, 'spike_rollback', "0 for a population (a rollback "
         "restores one run's state: purax train --spike-rollback)", optimizer.spike_rollback,
         ConfigError)


#: Characters a W&B project name may not hold (wandb refuses them at ``wandb.init``).
WANDB_FORBIDDEN = '/\\#?%:'


def resumable_changes() -> frozenset[str]:
  """``section.field`` of every field that may differ when a run is resumed
  (its metadata says so, :mod:`purax.app.fields`): it does not change the
  computation. ``steps`` and ``decay_steps`` train longer."""
  return frozenset(f'{section}.{name}' for section in SECTIONS
                   for name in fields.names(_section_type(TrainConfig, section), fields.RESUMABLE))


def _flag(section: str, field: str) -> str:
  """The flat name (CLI flag, format-1 key) of a section field."""
  return {('model', 'name'): 'model', ('data', 'name'): 'dataset',
          ('optimizer', 'name'): 'optimizer'}.get((section, field), field)


class Sections:
  """A config of sections (each field a section dataclass), spelled flat as the
  command line spells it: ``--model`` for ``model.name``, ``--steps`` for
  ``run.steps``."""

  @classmethod
  def of(cls, **flat: Any):
    """A config from flat names (the CLI's flags, or a format-1 ``config.json``):
    ``TrainConfig.of(model='lm', dataset='pystdlib', steps=100, learning_rate=1e-3)``.

    Raises:
      ConfigError: an unknown name, naming the known ones.
    """
    sections = [f.name for f in dataclasses.fields(cls)]
    where = {_flag(s, f.name): (s, f.name) for s in sections
             for f in dataclasses.fields(_section_type(cls, s))}
    unknown = sorted(set(flat) - set(where))
    expect(not unknown, 'config', f'fields among {sorted(where)}', unknown, ConfigError)
    parts = {s: {} for s in sections}
    for name, value in flat.items():
      section, field = where[name]
      parts[section][field] = value
    defaults = cls()
    return cls(**{s: dataclasses.replace(getattr(defaults, s), **parts[s]) for s in sections})

  def flat(self) -> dict[str, Any]:
    """The fields under their flat names (the inverse of :meth:`of`)."""
    return {_flag(s.name, f.name): getattr(getattr(self, s.name), f.name)
            for s in dataclasses.fields(self) for f in dataclasses.fields(getattr(self, s.name))}

  def hparams(self) -> dict[str, Any]:
    """The fields that change the computation (:func:`purax.app.fields.changes_computation`),
    under their flat names: a run's hyperparameters (TensorBoard's HParams);
    not the run directory, logging, checkpointing or debugging options."""
    return {_flag(s.name, f.name): getattr(getattr(self, s.name), f.name)
            for s in dataclasses.fields(self) for f in dataclasses.fields(getattr(self, s.name))
            if fields.changes_computation(f)}


def default_workdir(kind: str, dataset: str, model: str) -> str:
  """The run directory of a command run without ``--workdir``:
  ``runs/[KIND-]DATASET-MODEL-YYYYmmdd-HHMMSS`` (``kind``: ``''`` for train,
  ``'sweep'``, ``'lr'``), the names with ``:`` and ``/`` replaced by ``_``."""
  parts = [kind] if kind else []
  parts += [dataset.replace(':', '_').replace('/', '_'), model.replace(':', '_').replace('/', '_'),
            time.strftime('%Y%m%d-%H%M%S')]
  return os.path.join('runs', '-'.join(parts))


@dataclasses.dataclass(frozen=True)
class TrainConfig(Sections):
  """A training run: ``purax train``."""

  model: ModelConfig = ModelConfig()
  data: DataConfig = DataConfig()
  optimizer: OptimizerConfig = OptimizerConfig()
  run: RunConfig = RunConfig()

  def validate(self) -> 'TrainConfig':
    """Checks every field that can be checked without data, each in its section.

    Raises:
      ConfigError: naming the field, the expected and the actual value.
    """
    self._check_types()
    self.model.validate()
    self.data.validate()
    self.optimizer.validate()
    self.run.validate()
    expect(self.model.spec.tokens == self.data.spec.tokens, 'dataset',
           "'pystdlib' or 'text:PATH' (text) with --model lm, and only with it",
           f'{self.data.name!r} with --model {self.model.name}', ConfigError)
    expect(not self.optimizer.z_loss or self.data.spec.loss == 'language_model', 'z_loss',
           '0 unless the data is text (the z-loss is a language-model loss option)',
           f'{self.optimizer.z_loss} with --dataset {self.data.name}', ConfigError)
    m = self.optimizer.microbatches
    expect(self.data.batch_size % m == 0, 'batch_size', f'a multiple of microbatches={m}',
           self.data.batch_size, ConfigError)
    check_spike_window(self.optimizer)
    expect(self.optimizer.spike_rollback <= self.run.steps, 'spike_rollback',
           f"at most --steps={self.run.steps} (a rollback goes back at most to the run's "
           'start; 0: off)', self.optimizer.spike_rollback, ConfigError)
    return self

  def _check_types(self) -> None:
    """Each field of the type its annotation names (config.json may be edited)."""
    for section in SECTIONS:
      value = getattr(self, section)
      expect(isinstance(value, _section_type(type(self), section)), section,
             f'a {_section_type(type(self), section).__name__}', type(value).__name__,
             ConfigError)
      hints = typing.get_type_hints(type(value), include_extras=False)
      for item in dataclasses.fields(value):
        check_type(_flag(section, item.name), getattr(value, item.name), hints[item.name])

  def check_resumable(self, saved: 'TrainConfig', *, reached: int | None = None) -> None:
    """Checks that this config may continue a run saved with ``saved``.

    Only fields that do not change the computation may differ (logging,
    evaluation cadence, checkpointing, the progress bar), and ``steps`` (to
    train longer; not below ``reached``, the newest checkpoint's step).

    Raises:
      ConfigError: naming the first field that differs, with both values.
    """
    ours, theirs = self.saved_form(), saved.saved_form()
    for section in SECTIONS:
      for item in dataclasses.fields(getattr(ours, section)):
        if f'{section}.{item.name}' in resumable_changes():
          continue
        mine, old = (getattr(getattr(c, section), item.name) for c in (ours, theirs))
        expect(mine == old, _flag(section, item.name),
               f'{old!r} (as in the run being resumed; start a new --workdir to change it)',
               repr(mine), ConfigError)
    if reached is not None:
      expect(self.run.steps >= reached, 'steps', f'>= {reached} (the step of the newest '
             'checkpoint of the run being resumed)', self.run.steps, ConfigError)
    # The decay a run follows is part of its computation: unset means --steps.
    decay = lambda c: c.run.decay_steps or c.run.steps   # noqa: E731
    expect(reached is None or reached == 0 or decay(self) == decay(saved)
           or self.run.steps != saved.run.steps, 'decay_steps',
           f'{decay(saved)} (as in the run being resumed)', decay(self), ConfigError)

  def resolved(self) -> 'TrainConfig':
    """:meth:`saved_form` with ``workdir`` filled in
    (``runs/DATASET-MODEL-YYYYmmdd-HHMMSS`` when unset)."""
    config = self.saved_form()
    if config.run.workdir:
      return config
    return dataclasses.replace(config, run=dataclasses.replace(
        config.run, workdir=default_workdir('', self.data.name, config.model.name)))

  def saved_form(self) -> 'TrainConfig':
    """The fields as ``config.json`` records them: model sizes resolved to the
    model's defaults, a data file's path absolute (also applied to a saved
    config read back, so older runs compare equal)."""
    return dataclasses.replace(self, model=self.model.with_sizes(),
                               data=self.data.with_absolute_path())

  def as_dict(self) -> dict[str, Any]:
    """What ``config.json`` (and each checkpoint's metadata) holds: the sections
    and the format number."""
    return {'format': FORMAT, **dataclasses.asdict(self)}

  def to_json(self) -> str:
    return json.dumps(self.as_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_json(cls, text: str | bytes, source: str = 'config.json') -> 'TrainConfig':
    """The config a run saved, checked (format, types, required fields).

    Reads format 2 (sections) and format 1 (purax 0.1's flat object). A
    config without ``scan_layers`` (written before it was recorded) reads as
    ``scan_layers=True`` for a transformer or lm, and one without
    ``weight_decay_mask`` as ``'all'``: how those runs were trained.

    Raises:
      ConfigError: not JSON, not an object, another format (named), an
        unknown or missing field, or a field of the wrong type (naming it).
    """
    try:
      data = json.loads(text.decode('utf-8') if isinstance(text, bytes) else text)
    except UnicodeDecodeError as e:
      raise ConfigError(f'{source}: expected UTF-8 JSON text, got bytes that are not UTF-8 '
                        f'({e})') from None
    except ValueError as e:   # garbage bytes, truncation
      raise ConfigError(f'{source}: expected a JSON object, got unreadable text ({e})'
                        ) from None
    expect(isinstance(data, dict), 'config.json', 'a JSON object', type(data).__name__,
           ConfigError)
    version = data.pop('format', 1)
    expect(version in (1, FORMAT), 'config.json format', f'1 or {FORMAT} (this is purax '
           f'{__version__}; a newer purax wrote this run)', version, ConfigError)
    if version == 1:
      expect('model' in data, 'config.json', "the fields ['model']", "['model'] missing",
             ConfigError)
      config = cls.of(**data)
    else:
      missing = [s for s in SECTIONS if not isinstance(data.get(s), dict)]
      expect(not missing, 'config.json', f'the sections {list(SECTIONS)}', f'{missing} missing',
             ConfigError)
      unknown = sorted(set(data) - set(SECTIONS))
      expect(not unknown, 'config.json', f'the sections {list(SECTIONS)}', unknown, ConfigError)
      expect('name' in data['model'], 'config.json', "the fields ['model']", "['model'] missing",
             ConfigError)
      config = cls.of(**{_flag(s, k): v for s in SECTIONS for k, v in data[s].items()})
    if 'scan_layers' not in (data if version == 1 else data['model']):
      config = dataclasses.replace(config, model=config.model.saved_before_scan_layers())
    if 'weight_decay_mask' not in (data if version == 1 else data['optimizer']):
      # Saved before the option: weight decay applied to every leaf then.
      config = dataclasses.replace(config, optimizer=dataclasses.replace(
          config.optimizer, weight_decay_mask='all'))
    config._check_types()    # values are checked by validate(), where the run starts
    return config


def read_config(workdir: str) -> TrainConfig:
  """The config a run directory saved, once nothing under it is a symlink
  leading out of it (what is restored, resumed or exported is the run's own).

  Raises:
    ConfigError: ``workdir`` holds no ``config.json``, or it cannot be read
      (it is a link, or not JSON of a config); a symlink under ``workdir``
      leads out of it (named).
  """
  path = os.path.join(workdir, CONFIG)
  expect(os.path.isfile(path), 'workdir', 'a run directory with config.json',
         repr(workdir), ConfigError)
  check_no_links_out(workdir)
  with open_file(path, 'rb') as f:
    return TrainConfig.from_json(f.read(), path)


def _section_type(cls, section: str):
  return typing.get_type_hints(cls)[section]


def check_type(name: str, value, hint) -> None:
  """Raises ConfigError unless ``value`` is of the type ``hint`` names
  (``typeguard``, tyro's own checker; a bool is not taken for a number)."""
  options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) \
      else (hint,)
  try:
    typeguard.check_type(value, hint)
    ok = not isinstance(value, bool) or bool in options
  except typeguard.TypeCheckError:
    ok = False
  names = ' or '.join('None' if a is type(None) else ' or '.join(map(repr, typing.get_args(a)))
                      if typing.get_origin(a) is Literal else getattr(a, '__name__', str(a))
                      for a in options)
  expect(ok, name, names, f'{value!r} ({type(value).__name__})', ConfigError)
