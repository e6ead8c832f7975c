"""``purax train | eval | sweep | tune lr | ...``: the command line, typed through tyro.

Examples (each line is parsed and validated by ``tests/test_docs.py``):

.. code-block:: bash

  purax train                                   # CNN on digits
  purax train --dataset mnist1d --model cnn --steps 2000
  purax train --dataset npz:data.npz --model mlp --workdir runs/mine
  purax eval --workdir runs/mine
  purax train --workdir runs/mine               # resume an interrupted run
  purax export --workdir runs/mine              # jax.export artifact, symbolic batch
  purax export --workdir runs/mine --format onnx   # or savedmodel (TensorFlow)
  purax sweep --lr 1e-4,3e-4,1e-3 --seeds 0,1,2       # 9 runs, one program
  purax sweep --lr loguniform:1e-5:1e-2 --members 16
  purax train --model lm --dataset pystdlib --workdir runs/lm   # byte-level LM
  purax train --model lm --dataset pystdlib --fit-memory --memory-budget 8GiB  # what fits
  purax generate --workdir runs/lm --prompt 'def '             # sample from it
  purax plot --workdir runs/mine                # curves.png of a run or a sweep
  purax debug-nan --workdir runs/mine --step 41 # replay a skipped non-finite update
  purax tune lr --model cnn --steps 50          # learning-rate range test, one program
  purax train --model cnn --steps 100000 --time-budget 60s   # planned to 60 s; verdict.json
  purax sweep --lr 1e-3,1e-2 --seeds 0,1,2,3 --steps 100000 --time-budget 5m --baseline 0
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import warnings
from typing import Annotated, Literal, Sequence, Union

import tyro

from purax.app.config import TrainConfig, read_config
from purax.app.sweep_config import SweepConfig
from purax.app.tune_config import RangeConfig
from purax.core import lazy
from purax.io import signals
from purax.io.formats import FORMATS

#: The export formats' names: the keys of :data:`purax.io.formats.FORMATS`, the one table.
EXPORT_FORMATS = tuple(FORMATS)

#: Runs a parsed command (:func:`purax.app.commands.run`): imported once parsing is done,
#: so ``--help`` and an option error import no jax (everything above is light).
RUN = 'purax.app.commands:run'

# Flat flags (--model, --steps, --lr) over the nested sections.
Train = tyro.conf.OmitArgPrefixes[TrainConfig]
Sweep = tyro.conf.OmitArgPrefixes[SweepConfig]
Range = tyro.conf.OmitArgPrefixes[RangeConfig]


_TUNE_LR = ('Learning-rate range test: every rate of a log-spaced grid trained at once in one '
            'compiled program; a plot and a suggested --learning-rate.')


@dataclasses.dataclass(frozen=True)
class TuneConfig:
  """Tune a hyperparameter of a purax train job in few compiled programs.

  Attributes:
    what: the test to run: lr (the learning-rate range test).
  """

  # A union with a suppressed None (tyro's own idiom for one subcommand).
  what: Annotated[Union[Annotated[Range, tyro.conf.subcommand(
      'lr', description=_TUNE_LR)],
                        Annotated[None, tyro.conf.Suppress]], tyro.conf.arg(name='')]


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Evaluate a finished run's newest checkpoint on its test split.

  Attributes:
    workdir: the run directory written by `purax train`.
    batch_size: evaluation batch size; when unset the run's.
    best: evaluate the best checkpoint by the run's --best-metric (a run of
      --keep-best) instead of the newest.
  """

  workdir: str
  batch_size: int | None = None
  best: bool = False


@dataclasses.dataclass(frozen=True)
class ExportConfig:
  """Export a run's predict function (symbolic batch dimension).

  Attributes:
    workdir: the run directory written by `purax train`.
    out: output directory; when unset WORKDIR/export (jax) or WORKDIR/export-FORMAT.
    format: jax (jax.export), onnx (jax2onnx, checked by onnxruntime; the onnx
      extra) or savedmodel (jax2tf, checked by loading it back; TensorFlow).
    best: export the best checkpoint by the run's --best-metric (a run of
      --keep-best) instead of the newest.
  """

  workdir: str
  out: str | None = None
  format: Literal[EXPORT_FORMATS] = 'jax'
  best: bool = False


@dataclasses.dataclass(frozen=True)
class GenerateConfig:
  """Continue a prompt with a trained language model (--model lm).

  Attributes:
    workdir: the run directory written by `purax train --model lm`.
    prompt: the text to continue (UTF-8, at least one character).
    max_new_tokens: bytes to generate.
    temperature: sampling temperature; 0 for greedy decoding.
    seed: seed of the sampling key.
  """

  workdir: str
  prompt: str
  max_new_tokens: int = 200
  temperature: float = 0.8
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class PlotConfig:
  """Draw a run's or a sweep's learning curves (loss, accuracy, learning rate,
  grad norm; train and eval) to a PNG.

  Attributes:
    workdir: a run directory (metrics.jsonl) or a sweep directory (sweep.json).
    out: the PNG's path, in an existing directory; when unset WORKDIR/curves.png.
      Refused: one of the run's own files or anything in its subdirectories
      (config.json, metrics.jsonl, checkpoints/, ...; symlinks resolved), an
      existing directory, an existing file that is not a PNG.
  """

  workdir: str
  out: str | None = None


@dataclasses.dataclass(frozen=True)
class DebugNanConfig:
  """Replay an update that a run skipped as non-finite (saved under
  WORKDIR/nonfinite) and report where its first NaN or inf came from.

  Attributes:
    workdir: the run directory written by `purax train`.
    step: the update's state.step, as the run reported it; when unset the first saved.
  """

  workdir: str
  step: int | None = None


#: The subcommands: name -> (config type, description). ``purax NAME ...`` is
#: parsed against its own type only, so an option error names (and suggests)
#: that subcommand's options, not another's.
SUBCOMMANDS = {
    'train': (Train, 'Train a model.'),
    'eval': (EvalConfig, 'Evaluate a run.'),
    'export': (ExportConfig, "Export a run's predict function: jax.export, ONNX or SavedModel."),
    'sweep': (Sweep, 'Train a population of runs over hyperparameters and seeds.'),
    'generate': (GenerateConfig, 'Sample text from a trained language model.'),
    'plot': (PlotConfig, "Plot a run's or a sweep's learning curves to a PNG."),
    'debug-nan': (DebugNanConfig, 'Replay a skipped non-finite update of a run: where its '
                  'NaN came from.'),
    'tune': (tyro.conf.OmitSubcommandPrefixes[TuneConfig],
             'Tune a hyperparameter: `purax tune lr` (the learning-rate range test).'),
}

Command = Union[tuple(Annotated[kind, tyro.conf.subcommand(name, description=text)]
                      for name, (kind, text) in SUBCOMMANDS.items())]


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point of the ``purax`` command; returns the exit status.

  Exit status: 0 done; 2 bad input or a run that cannot go on, with a
  message naming the field; 128 + N when signal N (SIGINT 130, SIGTERM 143)
  arrived at any moment: before training started or during any other
  command (nothing written, or the command's output complete), during
  ``train``, ``sweep`` or ``tune lr`` (stopped after a committed checkpoint:
  the same command resumes), or a second time (at once) — each as its line
  says.
  Every ending is said once, where the command ends
  (:mod:`purax.io.signals`); the process's own command (``argv`` None)
  then ends with ``os._exit`` after a signal (``_exit_now``).
  """
  own = argv is None     # this process's own command line: it ends with the command
  argv = list(sys.argv[1:] if argv is None else argv)
  signalled = False
  try:
    with signals.exit_on_signals(), warnings.catch_warnings():
      warnings.showwarning = _one_line_for_purax(warnings.showwarning)
      status = _main(argv)
      signals.raise_pending()        # a second signal Python swallowed meanwhile
      status = _finished_after_signal(status)
      signalled = signals.received() is not None
  except SystemExit as e:            # a second signal: at once, the cleanups done
    if e.code is None or e.code != signals.last_exit():
      raise                          # --help, an option error (tyro)
    print(f'purax: stopped by {_signame(e.code)} (a second signal: at once; files are '
          f'written atomically, so nothing is half-written) (exit status {e.code})',
          file=sys.stderr)
    status, signalled = e.code, True
  if own:    # done: a signal from here (the interpreter's teardown) changes nothing
    for s in signals.SIGNALS:
      signal.signal(s, signal.SIG_IGN)
    if signalled:
      _exit_now(status)
  return status


def _signame(status: int) -> str:
  return signals.name(status - 128)


def _finished_after_signal(status: int) -> int:
  """The status of a command that a first signal reached after its last poll:
  ``128 + N``, said in a line (its output is complete); unchanged when it
  failed, or when ``train``/``sweep``/``tune`` took charge of the signal
  (:class:`purax.io.signals.StopOnSignal`: they said how they ended)."""
  signame = signals.received()
  if status != 0 or signame is None or signals.answered():
    return status
  status = signals.status(signal.Signals[signame])
  print(f'purax: stopped by {signame} as the command finished; its output is complete '
        f'(exit status {status})', file=sys.stderr)
  return status


def _exit_now(status: int) -> None:
  """Ends the process after a signal: output flushed, then ``os._exit``,
  without the interpreter's teardown (where jax's and orbax's threads,
  stopped in the middle of their work, can crash it); further signals are
  ignored (as by then in any ``purax`` process). Every purax file is closed (atomic writes, checkpoints
  committed or abandoned) by then. Not with several processes
  (``jax.distributed``): the interpreter's teardown disconnects from the
  others, which ``os._exit`` would leave to abort."""
  jax = sys.modules.get('jax')
  if jax is not None and jax.distributed.is_initialized():
    return
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:   # a closed pipe: nothing more can be said
      pass
  os._exit(status)


def _one_line_for_purax(show):
  """``warnings.showwarning`` that shows purax's own warnings (``purax: ...``,
  which name what and where) as one line, others with ``show``."""
  def show_warning(message, category, filename, lineno, file=None, line=None):
    if str(message).startswith('purax:'):
      print(message, file=sys.stderr if file is None else file)
    else:
      show(message, category, filename, lineno, file, line)
  return show_warning


def parse(argv: Sequence[str]):
  """The command object of ``argv`` (a config dataclass), without running it.

  ``train --workdir DIR`` on an existing run takes the run's saved config as
  the defaults, so a bare ``purax train --workdir DIR`` continues it and
  explicit options are checked against it.
  """
  argv = list(argv)
  saved = _saved_config(argv)
  if saved is not None:
    return tyro.cli(Train, args=argv[1:], default=saved, prog='purax train',
                    description=SUBCOMMANDS['train'][1])
  if argv[:2] == ['tune', 'lr']:   # parsed alone, so that its help and errors name it
    return TuneConfig(what=tyro.cli(Range, args=argv[2:], prog='purax tune lr',
                                    description=_TUNE_LR))
  if argv and argv[0] in SUBCOMMANDS:
    kind, text = SUBCOMMANDS[argv[0]]
    return tyro.cli(kind, args=argv[1:], prog=f'purax {argv[0]}', description=text)
  return tyro.cli(Command, args=argv, prog='purax',
                  description='purax: a pure-functional training core for JAX.')


def _main(argv: list[str]) -> int:
  command = parse(argv)          # first: --help and option errors exit here
  return lazy.resolve(RUN)(command)


def _saved_config(argv: list[str]) -> TrainConfig | None:
  """The saved config when ``argv`` is ``train ... --workdir DIR`` and DIR is a run."""
  if not argv or argv[0] != 'train':
    return None
  workdir = None
  for i, arg in enumerate(argv):
    if arg == '--workdir' and i + 1 < len(argv):
      workdir = argv[i + 1]
    elif arg.startswith('--workdir='):
      workdir = arg.split('=', 1)[1]
  if not workdir or not os.path.isfile(os.path.join(workdir, 'config.json')):
    return None
  try:
    return read_config(workdir)
  except (ValueError, TypeError):
    return None   # not ours to parse (or a link): train() reports it


if __name__ == '__main__':
  sys.exit(main())
