"""A Weights & Biases metric writer, imported only when asked for.

``wandb`` is an extra (``pip install 'purax[wandb]'``); nothing else in purax
imports it. The run is offline unless ``WANDB_MODE`` says otherwise (or
``mode=`` is given): files go to ``DIRECTORY/wandb/offline-run-*`` and
``wandb sync DIRECTORY/wandb/offline-run-*`` uploads them later. From the
command line: ``purax train --wandb-project NAME``.

Example (``mode='disabled'`` runs it without writing; the default is offline):

  >>> from purax.io.wandb_writer import WandbWriter
  >>> writer = WandbWriter('my-project', directory='runs/mine', config={'lr': 1e-3},
  ...                      mode='disabled')
  >>> writer.write_scalars(10, {'train/loss': 0.5})
  >>> writer.close()

  In a run: ``purax.fit(task, state, batches, hooks=purax.hooks.standard(writer=writer))``.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from purax.core.errors import ConfigError


class WandbWriter:
  """:class:`purax.io.writers.MetricWriter` onto a ``wandb`` run.

  Args:
    project: the W&B project.
    directory: where wandb writes (``directory/wandb/...``); created if missing.
    name: the run's display name.
    config: hyperparameters recorded with the run (more via ``write_hparams``).
    mode: ``'offline'``, ``'online'`` or ``'disabled'``; default ``WANDB_MODE``
      from the environment, else ``'offline'`` (no account, no network).
    **init_kwargs: passed to ``wandb.init``.

  Raises:
    ConfigError: wandb is not installed (naming the extra to install).
  """

  def __init__(self, project: str, *, directory: str | None = None, name: str | None = None,
               config: Mapping[str, Any] | None = None, mode: str | None = None,
               **init_kwargs: Any):
    try:
      import wandb
    except ImportError as e:
      raise ConfigError("wandb: expected the wandb package (pip install 'purax[wandb]'), "
                        f'got {e}') from e
    if directory is not None:
      os.makedirs(directory, exist_ok=True)
    mode = mode or os.environ.get('WANDB_MODE') or 'offline'
    self._run = wandb.init(project=project, dir=directory, name=name,
                           config=dict(config or {}), mode=mode, **init_kwargs)

  @property
  def run(self):
    """The ``wandb`` run (for ``run.dir``, artifacts, ...)."""
    return self._run

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    self._run.log({k: float(v) for k, v in scalars.items()}, step=int(step))

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    self._run.config.update(dict(hparams), allow_val_change=True)

  def flush(self) -> None:
    pass   # wandb writes in its own process

  def close(self) -> None:
    self._run.finish()
