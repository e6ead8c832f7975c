"""The typed run configuration, its validation, and what it builds.

``TrainConfig`` is a plain frozen dataclass: the CLI (tyro) turns its fields
into typed ``--options``, and the resolved config is saved as
``config.json`` in the run directory so ``purax eval`` can rebuild the task.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import typing
from typing import Literal

import numpy as np

from purax.core import objectives
from purax.core.errors import ConfigError, expect
from purax.core.optim import adamw
from purax.core.precision import get_policy
from purax.core.task import Task
from purax.io.text import is_text
from purax.nn.registry import MODELS, check_input_shape, get_model
from purax.nn.remat import check_remat

ModelName = Literal['cnn', 'mlp', 'resnet', 'transformer', 'lm']


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """A training run.

  Attributes:
    model: model name (cnn, mlp, resnet, transformer: an encoder classifier;
      lm: a byte-level decoder language model, for text datasets).
    dataset: 'digits', 'mnist1d', or 'npz:PATH' (arrays x_train, y_train, x_test,
      y_test); for --model lm: 'pystdlib' (the Python standard library's
      sources) or 'text:PATH' (any UTF-8 file).
    steps: optimizer updates.
    batch_size: examples per update.
    learning_rate: peak AdamW learning rate (after warmup; cosine decay to 0).
    warmup_steps: linear warmup length.
    weight_decay: decoupled weight decay.
    clip_norm: global-norm gradient clipping threshold.
    label_smoothing: label smoothing in [0, 1).
    dropout_rate: dropout rate of the model (mlp, cnn, transformer, lm).
    seed: seed of initialization, shuffling and dropout.
    workdir: run directory, runs/DATASET-MODEL-TIME when unset; an existing
      run directory is resumed from its newest committed checkpoint.
    log_every: write training metrics every N steps (the loop's only host sync).
    eval_every: evaluate on the test split every N steps (0: at the end only).
    eval_batch_size: examples per evaluation batch (the last is padded).
    num_classes: override the number of classes (npz data without num_classes).
    progress: show a progress bar.
    checkpoint_every: save a checkpoint every N steps (0: only at the end).
    keep_last: keep the newest N checkpoints.
    keep_best: also keep the best K checkpoints by eval accuracy (0: off).
    precision: 'fp32', 'bf16' (params float32, compute bfloat16), 'fp16' (with
      dynamic loss scaling) or 'params=DTYPE,compute=DTYPE,output=DTYPE'.
    microbatches: gradient accumulation: split each batch into N microbatches
      (batch_size must divide); one optimizer update per batch.
    remat: gradient checkpointing policy of resnet/transformer/lm blocks:
      none, full, dots_saveable, dots_with_no_batch_dims_saveable, ...
    loss_scale: initial dynamic loss scale when the precision computes in float16.
    max_consecutive_skips: stop with an error after N consecutive steps with
      non-finite gradients (each is skipped, the state unchanged).
    steps_per_call: run K steps per dispatch (lax.scan over K stacked batches;
      bitwise the same training; log/eval/checkpoint cadences must be
      multiples of K; one device only).
    debug_nans: turn on jax_debug_nans (slow: re-runs an op that makes a NaN
      un-jitted and raises where it happened).
    mesh: run on a device mesh, e.g. 'data=4,fsdp=2' (axes data, fsdp, tensor;
      one may be -1); the strategy follows the shape (purax.parallel.for_mesh).
    coordinator: multi-host: HOST:PORT of process 0 (jax.distributed).
    num_processes: multi-host: number of processes.
    process_id: multi-host: this process's index; only process 0 writes logs.
    seq_len: tokens (bytes) per example of a text dataset (--model lm).
    d_model: width of transformer/lm; when unset the model's own (64 / 128).
    num_layers: layers of transformer/lm; when unset the model's own (2 / 4).
    num_heads: attention heads of transformer/lm; when unset the model's own (4).
    dry_run: validate, build and compile the step, print the model summary and
      the step's FLOPs and memory, and exit without training or writing.
    profile: 'START:STOP': a jax.profiler trace of those steps in the run
      directory (tensorboard --logdir, xprof, or perfetto_trace.json.gz).
    profile_memory: with --profile, also write a device memory profile
      (memory.prof, pprof) when the trace stops.
    wandb_project: also log to Weights & Biases under this project (offline
      unless WANDB_MODE says otherwise; needs pip install 'purax[wandb]').
  """

  model: ModelName = 'cnn'
  dataset: str = 'digits'
  steps: int = 500
  batch_size: int = 64
  learning_rate: float = 2e-3
  warmup_steps: int = 50
  weight_decay: float = 1e-4
  clip_norm: float = 1.0
  label_smoothing: float = 0.0
  dropout_rate: float = 0.0
  seed: int = 0
  workdir: str | None = None
  log_every: int = 50
  eval_every: int = 250
  eval_batch_size: int = 512
  num_classes: int | None = None
  progress: bool = True
  checkpoint_every: int = 250
  keep_last: int = 2
  keep_best: int = 0
  precision: str = 'fp32'
  microbatches: int = 1
  remat: str = 'none'
  loss_scale: float = 2.0 ** 15
  max_consecutive_skips: int = 10
  steps_per_call: int = 1
  debug_nans: bool = False
  mesh: str | None = None
  coordinator: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  seq_len: int = 128
  d_model: int | None = None
  num_layers: int | None = None
  num_heads: int | None = None
  dry_run: bool = False
  profile: str | None = None
  profile_memory: bool = False
  wandb_project: str | None = None

  def validate(self) -> 'TrainConfig':
    """Checks every field that can be checked without data.

    Raises:
      ConfigError: naming the field, the expected and the actual value.
    """
    self._check_types()
    expect(self.model in MODELS, 'model', f'one of {sorted(MODELS)}', repr(self.model),
           ConfigError)
    # Counters are int32 on the device (state.step, the optimizer count).
    for name in ('steps', 'batch_size', 'warmup_steps', 'log_every', 'eval_every',
                 'eval_batch_size', 'checkpoint_every', 'keep_last', 'keep_best',
                 'microbatches', 'max_consecutive_skips', 'seq_len', 'd_model', 'num_layers',
                 'num_heads', 'num_classes'):
      value = getattr(self, name)
      expect(value is None or value < INT32_LIMIT, name, f'< 2**31', value, ConfigError)
    expect(self.seed < 2 ** 32, 'seed', 'in [0, 2**32)', self.seed, ConfigError)
    expect(self.num_classes is None or self.num_classes <= MAX_CLASSES, 'num_classes',
           f'<= {MAX_CLASSES}', self.num_classes, ConfigError)
    for name in ('learning_rate', 'weight_decay', 'clip_norm', 'loss_scale',
                 'label_smoothing', 'dropout_rate'):
      value = getattr(self, name)
      expect(math.isfinite(value), name, 'a finite number', value, ConfigError)
    expect(self.learning_rate <= 10, 'learning_rate', '<= 10 (AdamW steps are about the '
           'learning rate in size)', self.learning_rate, ConfigError)
    expect(0 <= self.weight_decay <= 1, 'weight_decay', 'in [0, 1]', self.weight_decay,
           ConfigError)
    expect(self.clip_norm > 0, 'clip_norm', '> 0', self.clip_norm, ConfigError)
    expect(self.loss_scale <= 2.0 ** 24, 'loss_scale', '<= 2**24', self.loss_scale,
           ConfigError)
    expect(self.steps >= 1, 'steps', '>= 1', self.steps, ConfigError)
    expect(self.batch_size >= 1, 'batch_size', '>= 1', self.batch_size, ConfigError)
    expect(self.learning_rate > 0, 'learning_rate', '> 0', self.learning_rate, ConfigError)
    expect(0 <= self.warmup_steps, 'warmup_steps', '>= 0', self.warmup_steps, ConfigError)
    expect(0 <= self.label_smoothing < 1, 'label_smoothing', 'in [0, 1)',
           self.label_smoothing, ConfigError)
    expect(0 <= self.dropout_rate < 1, 'dropout_rate', 'in [0, 1)', self.dropout_rate,
           ConfigError)
    expect(self.log_every >= 1, 'log_every', '>= 1', self.log_every, ConfigError)
    expect(self.eval_every >= 0, 'eval_every', '>= 0', self.eval_every, ConfigError)
    expect(self.eval_batch_size >= 1, 'eval_batch_size', '>= 1', self.eval_batch_size,
           ConfigError)
    expect(self.num_classes is None or self.num_classes >= 2, 'num_classes',
           '>= 2 or unset', self.num_classes, ConfigError)
    expect(self.seed >= 0, 'seed', '>= 0', self.seed, ConfigError)
    expect((self.model == 'lm') == is_text(self.dataset), 'dataset',
           "'pystdlib' or 'text:PATH' (text) with --model lm, and only with it",
           f'{self.dataset!r} with --model {self.model}', ConfigError)
    expect(self.seq_len >= 1, 'seq_len', '>= 1', self.seq_len, ConfigError)
    for name in ('d_model', 'num_layers', 'num_heads'):
      value = getattr(self, name)
      expect(value is None or value >= 1, name, '>= 1 or unset', value, ConfigError)
    expect(self.checkpoint_every >= 0, 'checkpoint_every', '>= 0', self.checkpoint_every,
           ConfigError)
    expect(self.keep_last >= 1, 'keep_last', '>= 1', self.keep_last, ConfigError)
    expect(self.keep_best >= 0, 'keep_best', '>= 0', self.keep_best, ConfigError)
    get_policy(self.precision)
    check_remat(self.remat)
    expect(self.microbatches >= 1, 'microbatches', '>= 1', self.microbatches, ConfigError)
    expect(self.batch_size % self.microbatches == 0, 'batch_size',
           f'a multiple of microbatches={self.microbatches}', self.batch_size, ConfigError)
    expect(self.loss_scale >= 1, 'loss_scale', '>= 1', self.loss_scale, ConfigError)
    expect(self.max_consecutive_skips >= 1, 'max_consecutive_skips', '>= 1',
           self.max_consecutive_skips, ConfigError)
    k = self.steps_per_call
    expect(1 <= k < INT32_LIMIT, 'steps_per_call', '>= 1', k, ConfigError)
    for name in ('log_every', 'eval_every', 'checkpoint_every'):
      expect(getattr(self, name) % k == 0, name, f'a multiple of steps_per_call={k}',
             getattr(self, name), ConfigError)
    expect(k == 1 or self.mesh is None, 'steps_per_call', '1 with --mesh (multi-step calls '
           'run on one device)', k, ConfigError)
    if self.mesh is not None:
      from purax.parallel.mesh import parse_mesh
      parse_mesh(self.mesh)
    if self.profile is not None:
      from purax.io.profile import parse_range
      parse_range(self.profile)
    if self.wandb_project is not None:
      import importlib.util
      expect(importlib.util.find_spec('wandb') is not None, 'wandb_project',
             "the wandb package installed (pip install 'purax[wandb]')", 'no wandb', ConfigError)
    return self

  def _check_types(self) -> None:
    """Each field of the type its annotation names (config.json may be edited)."""
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(self):
      value, hint = getattr(self, field.name), hints[field.name]
      allowed = tuple(a for a in typing.get_args(hint) if isinstance(a, type)) or (
          (str,) if typing.get_origin(hint) is Literal else (hint,))
      ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
      if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        ok = True
      names = ' or '.join('None' if a is type(None) else a.__name__ for a in allowed)
      expect(ok, field.name, names, f'{value!r} ({type(value).__name__})', ConfigError)

  def check_resumable(self, saved: 'TrainConfig') -> None:
    """Checks that this config may continue a run saved with ``saved``.

    Only fields that do not change the computation may differ (logging,
    evaluation cadence, checkpointing, the progress bar).

    Raises:
      ConfigError: naming the first field that differs, with both values.
    """
    ours, saved = self._as_saved(), saved._as_saved()
    for field in dataclasses.fields(self):
      if field.name in RESUMABLE_CHANGES:
        continue
      mine, theirs = getattr(ours, field.name), getattr(saved, field.name)
      expect(mine == theirs, field.name,
             f'{theirs!r} (as in the run being resumed; start a new --workdir to change it)',
             repr(mine), ConfigError)

  def resolved(self) -> 'TrainConfig':
    """With ``workdir`` filled in (``runs/DATASET-MODEL-YYYYmmdd-HHMMSS``), the
    model sizes left unset taken from the model's defaults, so that the saved
    ``config.json`` records the sizes trained, not ``null`` (a later change of
    a model default cannot change what a saved run restores), and a data
    file's path made absolute."""
    config = self._as_saved()
    if config.workdir:
      return config
    name = self.dataset.replace(':', '_').replace('/', '_')
    stamp = time.strftime('%Y%m%d-%H%M%S')
    return dataclasses.replace(config,
                               workdir=os.path.join('runs', f'{name}-{config.model}-{stamp}'))

  def _as_saved(self) -> 'TrainConfig':
    """The fields as ``config.json`` records them: model sizes resolved, data
    file path absolute (also applied to an older run's saved config)."""
    return self.with_model_sizes().with_absolute_dataset()

  def with_absolute_dataset(self) -> 'TrainConfig':
    """``npz:PATH`` / ``text:PATH`` / ``PATH.npz`` with an absolute PATH, so that
    a saved run's eval, export, generate and resume work from any directory."""
    name = self.dataset
    for prefix in ('npz:', 'text:', ''):
      if name.startswith(prefix) and (prefix or name.endswith('.npz')):
        return dataclasses.replace(
            self, dataset=prefix + os.path.abspath(name[len(prefix):]))
    return self

  def with_model_sizes(self) -> 'TrainConfig':
    """``d_model``, ``num_layers``, ``num_heads`` that are None set to the
    defaults of the transformer / lm model class (unchanged for other models)."""
    if self.model not in ('transformer', 'lm'):
      return self
    defaults = {f.name: f.default for f in dataclasses.fields(MODELS[self.model])}
    return dataclasses.replace(self, **{k: defaults[k] for k in MODEL_SIZES
                                        if getattr(self, k) is None})

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> 'TrainConfig':
    """The config a run saved, checked (types, required fields, values).

    Raises:
      ConfigError: not JSON, not an object, an unknown or missing field, or a
        field of the wrong type (naming it).
    """
    try:
      data = json.loads(text)
    except ValueError as e:   # garbage bytes, truncation, invalid UTF-8
      raise ConfigError(f'config.json: expected a JSON object, got unreadable text ({e})'
                        ) from None
    expect(isinstance(data, dict), 'config.json', 'a JSON object', type(data).__name__,
           ConfigError)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    expect(not unknown, 'config.json', f'fields among {sorted(known)}', unknown, ConfigError)
    missing = [k for k in REQUIRED_SAVED if k not in data]
    expect(not missing, 'config.json', f'the fields {list(REQUIRED_SAVED)}',
           f'{missing} missing', ConfigError)
    config = cls(**data)
    config._check_types()    # values are checked by validate(), where the run starts
    return config


#: Fields a saved config.json must hold (purax writes every field; a missing
#: model would silently become the default one).
REQUIRED_SAVED = ('model',)
INT32_LIMIT = 2 ** 31
#: More classes than this is refused (the output layer alone would not fit).
MAX_CLASSES = 2 ** 24

#: Model sizes of TrainConfig that default to the model class's own.
MODEL_SIZES = ('d_model', 'num_layers', 'num_heads')

RESUMABLE_CHANGES = frozenset({'workdir', 'progress', 'log_every', 'eval_every',
                               'eval_batch_size', 'checkpoint_every', 'keep_last', 'keep_best',
                               'mesh', 'coordinator', 'num_processes', 'process_id',
                               'max_consecutive_skips', 'debug_nans', 'dry_run', 'profile',
                               'profile_memory', 'wandb_project', 'steps_per_call'})


def build_task(config: TrainConfig, *, num_classes: int, input_shape) -> Task:
  """The Task (model, AdamW, objective) of a config, checked against the data.

  Raises:
    DataError: inputs of ``input_shape`` do not suit the model.
  """
  kwargs = {'dropout_rate': config.dropout_rate} if config.model in ('mlp', 'cnn') else {}
  if config.model in ('transformer', 'lm'):
    kwargs = {k: getattr(config, k) for k in ('dropout_rate', *MODEL_SIZES)
              if getattr(config, k) is not None}
    if config.model == 'lm':
      kwargs['max_len'] = config.seq_len
  policy = get_policy(config.precision)
  kwargs.update(policy.model_kwargs())
  if config.remat != 'none':
    expect(config.model in ('resnet', 'transformer', 'lm'), 'remat',
           "'none' for mlp and cnn (remat applies to resnet, transformer and lm blocks)",
           repr(config.remat), ConfigError)
    kwargs['remat'] = config.remat
  model = get_model(config.model, num_classes=num_classes, **kwargs)
  check_input_shape(model, (1, *input_shape), field='x_train')
  tx = adamw(learning_rate=config.learning_rate, total_steps=config.steps,
             warmup_steps=min(config.warmup_steps, config.steps),
             weight_decay=config.weight_decay, clip_norm=config.clip_norm)
  return Task(model=model, tx=tx,
              loss=objectives.language_model if config.model == 'lm' else objectives.classification,
              hparams={'label_smoothing': config.label_smoothing},
              microbatches=config.microbatches,
              loss_scale=config.loss_scale if policy.needs_loss_scaling else None)


def sample_batch(x: np.ndarray, y: np.ndarray, batch_size: int) -> dict[str, np.ndarray]:
  """A zero batch of the data's shapes (enough for ``init`` and ``eval_shape``)."""
  x_dtype = np.int32 if np.issubdtype(x.dtype, np.integer) else np.float32   # token ids
  return {'x': np.zeros((batch_size, *x.shape[1:]), x_dtype),
          'y': np.zeros((batch_size, *y.shape[1:]), y.dtype)}
