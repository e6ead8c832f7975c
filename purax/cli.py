"""``purax train | eval``: the command line, typed by dataclasses through tyro.

Examples::

  purax train                                   # CNN on digits
  purax train --dataset mnist1d --model cnn --steps 2000
  purax train --dataset npz:data.npz --model mlp --workdir runs/mine
  purax eval --workdir runs/mine
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Annotated, Sequence, Union

import tyro

from purax.config import TrainConfig
from purax.core.errors import PuraxError


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Evaluate a finished run's newest checkpoint on its test split.

  Attributes:
    workdir: the run directory written by `purax train`.
    batch_size: evaluation batch size (default: the run's).
  """

  workdir: str
  batch_size: int | None = None


Command = Union[
    Annotated[TrainConfig, tyro.conf.subcommand('train', description='Train a model.')],
    Annotated[EvalConfig, tyro.conf.subcommand('eval', description='Evaluate a run.')],
]


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point of the ``purax`` command; returns the exit status."""
  command = tyro.cli(Command, args=argv, prog='purax',
                     description='purax: a pure-functional training core for JAX.')
  # Import after parsing so that `purax --help` stays fast.
  from purax import runs
  try:
    if isinstance(command, TrainConfig):
      metrics = runs.train(command)
      print(json.dumps({'final': metrics}, indent=None))
    else:
      metrics = runs.evaluate_run(command.workdir, batch_size=command.batch_size)
      print(json.dumps({'eval': metrics}, indent=None))
  except (PuraxError, FileExistsError, FileNotFoundError) as e:
    print(f'purax: error: {e}', file=sys.stderr)
    return 2
  return 0


if __name__ == '__main__':
  sys.exit(main())
