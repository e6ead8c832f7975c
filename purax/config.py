"""The typed run configuration, its validation, and what it builds.

``TrainConfig`` is a plain frozen dataclass: the CLI (tyro) turns its fields
into typed ``--options``, and the resolved config is saved as
``config.json`` in the run directory so ``purax eval`` can rebuild the task.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Literal

import numpy as np

from purax.core.errors import ConfigError, expect
from purax.core.optim import adamw
from purax.core.task import Task
from purax.nn.registry import MODELS, check_input_shape, get_model

ModelName = Literal['cnn', 'mlp', 'resnet']


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """A training run.

  Attributes:
    model: model name (cnn, mlp, resnet).
    dataset: 'digits', 'mnist1d', or 'npz:PATH' (arrays x_train, y_train, x_test, y_test).
    steps: optimizer updates.
    batch_size: examples per update.
    learning_rate: peak AdamW learning rate (after warmup; cosine decay to 0).
    warmup_steps: linear warmup length.
    weight_decay: decoupled weight decay.
    clip_norm: global-norm gradient clipping threshold.
    label_smoothing: label smoothing in [0, 1).
    dropout_rate: dropout rate of the model (mlp, cnn).
    seed: seed of initialization, shuffling and dropout.
    workdir: run directory (default: runs/DATASET-MODEL-TIME); must not exist.
    log_every: write training metrics every N steps (the loop's only host sync).
    eval_every: evaluate on the test split every N steps (0: at the end only).
    eval_batch_size: examples per evaluation batch (the last is padded).
    num_classes: override the number of classes (npz data without num_classes).
    progress: show a progress bar.
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

  def validate(self) -> 'TrainConfig':
    """Checks every field that can be checked without data.

    Raises:
      ConfigError: naming the field, the expected and the actual value.
    """
    expect(self.model in MODELS, 'model', f'one of {sorted(MODELS)}', repr(self.model),
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
    return self

  def resolved(self) -> 'TrainConfig':
    """With ``workdir`` filled in (``runs/DATASET-MODEL-YYYYmmdd-HHMMSS``)."""
    if self.workdir:
      return self
    name = self.dataset.replace(':', '_').replace('/', '_')
    stamp = time.strftime('%Y%m%d-%H%M%S')
    return dataclasses.replace(self, workdir=os.path.join('runs', f'{name}-{self.model}-{stamp}'))

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> 'TrainConfig':
    data = json.loads(text)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    expect(not unknown, 'config.json', f'fields among {sorted(known)}', unknown, ConfigError)
    return cls(**data)


def build_task(config: TrainConfig, *, num_classes: int, input_shape) -> Task:
  """The Task (model, AdamW, objective) of a config, checked against the data.

  Raises:
    DataError: inputs of ``input_shape`` do not suit the model.
  """
  kwargs = {'dropout_rate': config.dropout_rate} if config.model in ('mlp', 'cnn') else {}
  model = get_model(config.model, num_classes=num_classes, **kwargs)
  check_input_shape(model, (1, *input_shape), field='x_train')
  tx = adamw(learning_rate=config.learning_rate, total_steps=config.steps,
             warmup_steps=min(config.warmup_steps, config.steps),
             weight_decay=config.weight_decay, clip_norm=config.clip_norm)
  return Task(model=model, tx=tx, objective='classification',
              label_smoothing=config.label_smoothing)


def sample_batch(x: np.ndarray, y: np.ndarray, batch_size: int) -> dict[str, np.ndarray]:
  """A zero batch of the data's shapes (enough for ``init`` and ``eval_shape``)."""
  return {'x': np.zeros((batch_size, *x.shape[1:]), np.float32),
          'y': np.zeros((batch_size, *y.shape[1:]), y.dtype)}
