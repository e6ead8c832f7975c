"""What each ``purax`` subcommand does once its options are parsed: the
runs, sweeps, plots and exports behind :mod:`purax.app.cli`, which imports
this module (and with it jax) only after parsing, through
:func:`purax.core.lazy.resolve`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from purax.app import dry_run, plot, runs, sweep, tune
from purax.app.cli import (DebugNanConfig, ExportConfig, GenerateConfig, PlotConfig,
                           TuneConfig)
from purax.app.config import TrainConfig
from purax.app.sweep_config import SweepConfig
from purax.core.errors import PuraxError
from purax.io import signals


def run(command) -> int:
  """Runs a parsed ``purax`` command (:func:`purax.app.cli.parse`), prints its
  result (one JSON line; ``generate``: the text) and returns the exit status
  (:func:`purax.app.cli.main` says which).

  A first SIGTERM/SIGINT is answered at the command's safe points
  (:func:`purax.io.signals.check`: before its work, and before its result
  is printed or published): ``128 + N``, said in one line, nothing written;
  ``train``, ``sweep`` and ``tune lr`` poll at every step and stop after a
  checkpoint, resumable: ``128 + N`` too, said in their line.
  """
  try:
    signals.check('during start-up')
    if isinstance(command, TrainConfig) and command.run.dry_run:
      print(json.dumps({'dry_run': dry_run.dry_run(command)}))
    elif isinstance(command, TrainConfig):
      metrics = runs.train(command)
      print(json.dumps({'final': metrics}, indent=None))
      return _stopped(metrics)
    elif isinstance(command, SweepConfig):
      summary = sweep.run(command)
      print(json.dumps({'sweep': summary} if 'best' not in summary else
                       {'best': summary['best'], 'top': summary['members'][:1]}))
      return _stopped(summary)
    elif isinstance(command, GenerateConfig):
      text = runs.generate_run(
          command.workdir, command.prompt, max_new_tokens=command.max_new_tokens,
          temperature=command.temperature, seed=command.seed)
      signals.check('while generating (nothing printed)')
      print(command.prompt + text)
    elif isinstance(command, PlotConfig):
      print(json.dumps({'plot': plot.plot(command.workdir, command.out)}))
    elif isinstance(command, DebugNanConfig):
      report, saved = runs.debug_nan_run(command.workdir, command.step)
      signals.check('while replaying the update (nothing printed)')
      print(f'purax: non-finite {report}', file=sys.stderr)
      print(json.dumps({'replayed': report.as_dict(), 'saved': saved}))
    elif isinstance(command, TuneConfig):
      summary = tune.run(command.what)
      if 'suggestion' not in summary:
        print(json.dumps({'lr_range': summary}))
      else:
        print(json.dumps({'lr_range': {k: summary[k] for k in ('suggestion', 'rule', 'plot',
                                                               'flags')}}))
      return _stopped(summary)
    elif isinstance(command, ExportConfig):
      print(json.dumps({'exported': export_staged(command)}))
    else:
      metrics, step = runs.evaluate_run(command.workdir, batch_size=command.batch_size,
                                        best=command.best, with_step=True)
      signals.check('while evaluating (nothing printed)')
      print(json.dumps({'eval': metrics, 'step': step,
                        'checkpoint': 'best' if command.best else 'newest'}, indent=None))
  except (PuraxError, FileExistsError, FileNotFoundError) as e:
    print(f'purax: error: {e}', file=sys.stderr)
    return 2
  except OSError as e:   # an unwritable or vanished path met while running: named
    print(f'purax: error: {e.filename or "a file"}: expected writable and present, got '
          f'{e.strerror or e}', file=sys.stderr)
    return 2
  except (runs.StoppedBeforeStart, signals.Stopped) as e:
    print(f'purax: {e} (exit status {e.status})', file=sys.stderr)
    return e.status
  return 0


def _stopped(result: dict) -> int:
  """The exit status of a train, sweep or tune result: ``128 + N`` when signal
  N stopped it (a checkpoint committed, said in its line), else 0."""
  by = result.get('stopped_by')
  return signals.status(signals.NAMES[by]) if by in signals.NAMES else 0


def export_staged(command: ExportConfig) -> str:
  """``purax export``: the artifact written into a sibling staging directory,
  then renamed into place (a previous export replaced), so that the export
  directory is absent or complete whenever the command ends; a first signal
  before the rename leaves nothing. Returns the artifact's path."""
  out = command.out or os.path.join(
      command.workdir, 'export' if command.format == 'jax' else f'export-{command.format}')
  out = out.rstrip(os.sep) or out
  staging, old = f'{out}.partial-{os.getpid()}', f'{out}.replaced-{os.getpid()}'
  try:
    path = runs.export_run(command.workdir, out=staging, format=command.format,
                           best=command.best)
    signals.check('while exporting')
    with signals.deferred():        # a second signal waits for the renames
      if not os.path.lexists(out):
        os.rename(staging, out)
      else:                         # its entries replace those of an earlier export only
        os.makedirs(old)
        for name in sorted(os.listdir(staging)):
          target = os.path.join(out, name)
          if os.path.isdir(target) and not os.path.islink(target):
            os.rename(target, os.path.join(old, name))
          os.replace(os.path.join(staging, name), target)
  finally:
    for leftover in (staging, old):
      shutil.rmtree(leftover, ignore_errors=True)
  return out + path[len(staging):]
