"""What each ``purax`` subcommand does once its options are parsed: the
runs, sweeps, plots and exports behind :mod:`purax.app.cli`, which imports
this module (and with it jax) only after parsing, through
:func:`purax.core.lazy.resolve`.
"""

from __future__ import annotations

import json
import sys

from purax.io import signals

from purax.app import dry_run, plot, runs, sweep, tune
from purax.app.cli import (DebugNanConfig, ExportConfig, GenerateConfig, PlotConfig,
                           TuneConfig)
from purax.app.config import TrainConfig
from purax.app.sweep_config import SweepConfig
from purax.core.errors import PuraxError


def run(command) -> int:
  """Runs a parsed ``purax`` command (:func:`purax.app.cli.parse`), prints its
  result (one JSON line; ``generate``: the text) and returns the exit status
  (:func:`purax.app.cli.main` says which)."""
  try:
    if isinstance(command, TrainConfig) and command.run.dry_run:
      print(json.dumps({'dry_run': dry_run.dry_run(command)}))
    elif isinstance(command, TrainConfig):
      metrics = runs.train(command)
      print(json.dumps({'final': metrics}, indent=None))
      if 'stopped_by' in metrics and metrics['stopped_by'] in signals.NAMES:
        return signals.status(signals.NAMES[metrics['stopped_by']])   # resumable, said
    elif isinstance(command, SweepConfig):
      summary = sweep.run(command)
      print(json.dumps({'best': summary['best'], 'top': summary['members'][:1]}))
    elif isinstance(command, GenerateConfig):
      print(command.prompt + runs.generate_run(
          command.workdir, command.prompt, max_new_tokens=command.max_new_tokens,
          temperature=command.temperature, seed=command.seed))
    elif isinstance(command, PlotConfig):
      print(json.dumps({'plot': plot.plot(command.workdir, command.out)}))
    elif isinstance(command, DebugNanConfig):
      report, saved = runs.debug_nan_run(command.workdir, command.step)
      print(f'purax: non-finite {report}', file=sys.stderr)
      print(json.dumps({'replayed': report.as_dict(), 'saved': saved}))
    elif isinstance(command, TuneConfig):
      summary = tune.run(command.what)
      print(json.dumps({'lr_range': {k: summary[k] for k in ('suggestion', 'rule', 'plot',
                                                             'flags')}}))
    elif isinstance(command, ExportConfig):
      path = runs.export_run(command.workdir, out=command.out, format=command.format,
                             best=command.best)
      print(json.dumps({'exported': path}))
    else:
      metrics = runs.evaluate_run(command.workdir, batch_size=command.batch_size,
                                  best=command.best)
      print(json.dumps({'eval': metrics}, indent=None))
  except (PuraxError, FileExistsError, FileNotFoundError) as e:
    print(f'purax: error: {e}', file=sys.stderr)
    return 2
  except OSError as e:   # an unwritable or vanished path met while running: named
    print(f'purax: error: {e.filename or "a file"}: expected writable and present, got '
          f'{e.strerror or e}', file=sys.stderr)
    return 2
  except runs.StoppedBeforeStart as e:
    print(f'purax: {e} (exit status {e.status})', file=sys.stderr)
    return e.status
  return 0
