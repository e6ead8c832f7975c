"""A whole run from a config: ``purax train`` (and ``eval``, ``export``,
``generate``) as a short sequence of named steps.

:func:`train` connects the processes, checks the config, opens the run
directory (:class:`purax.app.rundir.RunDir`), builds everything
(:func:`purax.app.job.build`) before a file is written, then creates the
directory, restores or initialises the state, opens the writers and calls
:func:`purax.fit` — the one host loop. A run directory that exists is resumed
from its newest committed checkpoint, with the same data order and
randomness (batches are random access by step and the step key is
``fold_in(rng, step)``); with a larger ``--steps`` a finished run trains on.
SIGTERM and SIGINT finish the current step, save, wait for the commit and
return normally.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from purax import hooks as hooks_lib
from purax import parallel
from purax.app import calibrate
from purax.app import job as job_lib
from purax.app import fit_memory
from purax.app import rundir as rundir_lib
from purax.app import verdict as verdict_lib
from purax.app.config import TrainConfig
from purax.app.dry_run import print_summary
from purax.core.errors import ConfigError, DataError, NonFiniteError, PuraxError, expect
from purax.io import compile_time, datasets, export, progress, profile, text, writers
from purax.io.checkpoint import Checkpointer, CheckpointError, CheckpointMismatchError
from purax.io.checkpoint import replay
from purax.io.checkpoint.run import Restored, abstract_checkpoint
from purax.resume import restore_or_init
from purax.io import signals
from purax.io.signals import StopOnSignal
from purax.hooks import time_budget as budget_lib
from purax.hooks.record import DONE, End
from purax.inspect import nan as nonfinite
from purax.loop import evaluate, fit
from purax.nn.generate import generate
from purax.plan import SingleDevicePlan
from purax.plan import memory as plan_memory


class StoppedBeforeStart(Exception):
  """A SIGTERM/SIGINT arrived during start-up (loading, tracing), before anything
  was written; ``status`` is the documented exit status (128 + signal number)."""

  def __init__(self, signame: str, phase: str):
    self.signame, self.status = signame, signals.status(signal.Signals[signame])
    super().__init__(f'stopped by {signame} during start-up ({phase}); nothing written')


def train(config: TrainConfig) -> dict:
  """Runs ``config`` end to end, or resumes it; returns the final evaluation metrics.

  Writes ``WORKDIR/config.json``, ``metrics.jsonl``, TensorBoard events,
  ``checkpoints/`` and ``final_metrics.json``. When stopped by SIGTERM/SIGINT
  it returns ``{'stopped_by': SIGNAL, 'step': s}`` after committing a
  checkpoint at step ``s``. On a ``--time-budget`` a new ``--plan-decay`` run
  plans its steps before its first (:func:`plan_schedule`), a step that runs out of memory
  is fitted again and the run resumed (:func:`refit`), and ``verdict.json``
  is written.

  Raises:
    ConfigError, DataError: before anything is written (also when a resumed
      run's config differs in a field that changes the computation);
    FileExistsError: ``workdir`` exists but is not a purax run directory;
    CheckpointError: a checkpoint cannot be written or read;
    OutOfMemoryError: the step does not fit (named with the configurations
      that would; on a budget, when none fits below the step that failed).
  """
  config = connect(config)
  # From here a first SIGTERM/SIGINT only sets a flag: start-up stops at its
  # next phase boundary (nothing written), training at the next step (a
  # checkpoint committed).
  with StopOnSignal() as stop, rundir_lib.RunDir(config) as rundir:
    starting = _start_phases(stop)
    starting('checking the run directory')
    fitted_now = config.run.fit_memory and not rundir.resuming
    if fitted_now:   # a resumed run keeps its choice
      config, _ = fit_memory.fit_config(config, stream=sys.stderr if rundir.primary else None)
      rundir.config = config
      starting('fitting the step in memory')
    began = time.monotonic()
    job = build_job(config, rundir, starting)
    build_s = time.monotonic() - began
    rundir.create()
    if rundir.primary:
      print(f'purax: run directory {rundir.path}', file=sys.stderr)
    # --plan-decay: a new run on a budget (or one killed before its first checkpoint)
    # plans its steps first, so that its decay ends with the budget.
    planning = (config.run.plan_decay and not job.config.run.decay_steps
                and newest_step(rundir) is None)
    planned = None
    while True:
      try:
        if planning:
          job, planned = plan_schedule(job, rundir, starting, rebuild_s=build_s)
          planning = False
        trained = _attempt(job, rundir, stop)
      except jax.errors.JaxRuntimeError as e:
        if job.config.run.time_budget is None or not profile.is_out_of_memory(e):
          raise
        config, restart = refit(job, rundir, e)   # the next attempt resumes from `restart`
        job = job_lib.build(config, phase=starting)
        planning = planning or (planned is not None and restart == 0)   # planned again
        continue
      if isinstance(trained, dict):
        return trained          # an ended run: config.json as it was, nothing ran
      state, history = trained
      return finish(job, rundir, state, history, stop, fitted_now=fitted_now, planned=planned)


def newest_step(rundir) -> int | None:
  """The step of the run's newest committed checkpoint, or None (none yet)."""
  if not os.path.isdir(rundir.file('checkpoints')):
    return None
  with Checkpointer(rundir.file('checkpoints'), read_only=True, interval_s=None) as reader:
    return max(reader.steps(), default=None)


def build_job(config: TrainConfig, rundir, phase) -> job_lib.Job:
  """The run's job (:func:`purax.app.job.build`), its summary printed; a
  resumed ``--plan-decay`` run follows the schedule planned when it began
  (``config.json``, :func:`plan_schedule`). ``rundir.config`` follows."""
  if config.run.plan_decay and not config.run.decay_steps and rundir.resuming:
    config = dataclasses.replace(config, run=dataclasses.replace(
        config.run, decay_steps=rundir.saved_config().run.decay_steps))
  job = job_lib.build(config, phase=phase)
  job_lib.check_best_metric(job)
  if rundir.primary:
    print_summary(job.abstract['state'], shardings=job.plan.state_sharding)
  rundir.config = config
  return job


def plan_schedule(job, rundir, phase, *, rebuild_s: float) -> tuple[job_lib.Job, dict]:
  """A new ``--plan-decay`` run on a ``--time-budget``: its steps
  planned on a throwaway copy (:func:`purax.app.calibrate.calibrated`) and,
  when fewer than ``--steps``, its schedule decaying over them: the job
  built again with them and ``config.json`` recording them. Returns the job
  and what was measured.

  Raises:
    ConfigError: naming ``time_budget``, a budget too short for one step.
    jax.errors.JaxRuntimeError: the step ran out of memory (fitted again by :func:`train`).
  """
  config, planned = calibrate.calibrated(job, rebuild_s=rebuild_s)
  say_calibration(planned, config)
  if planned['decay_steps'] is not None:
    job = job_lib.build(config, phase=phase)
    rundir.replace_config(config)
  phase('planning the steps in the budget')
  return job, planned


def say_calibration(planned: dict, config: TrainConfig) -> None:
  """What :func:`purax.app.calibrate.calibrated` planned, in words on stderr."""
  if 'not_planned' in planned:
    print(f'purax: the steps are not planned ahead: {planned["not_planned"]}; the '
          f'learning-rate schedule spans --steps {config.run.steps}', file=sys.stderr)
  elif planned['planned_steps'] is not None:
    decay = (f'the learning-rate schedule decays over them (--decay-steps '
             f'{planned["decay_steps"]}, recorded in config.json)'
             if planned['decay_steps'] is not None else
             f'--steps {config.run.steps} comes first')
    print(f'purax: {planned["planned_steps"]} steps fit in the budget (measured on a '
          f'throwaway copy: {planned["step_s"] * 1e3:.3g} ms a step, compilation '
          f'{planned["compile_s"]:.1f} s); {decay}', file=sys.stderr)


def _attempt(job, rundir, stop):
  """Restores or initialises the state and trains (:func:`_fit`): ``(state,
  history)``, or the final metrics of a run that has already ended
  (:func:`ended_run`)."""
  config = job.config
  try:
    with Checkpointer(rundir.file('checkpoints'), keep_last=config.run.keep_last,
                      keep_best=config.run.keep_best, best_metric=config.run.best().key,
                      best_mode=config.run.best_mode, metadata=job.metadata(),
                      interval_s=config.run.checkpoint_interval_s or None) as checkpointer:
      try:
        restored = resume(job, rundir, checkpointer)
        ended = ended_run(job, rundir, restored)
        if ended is not None:
          return ended
        if not restored.fresh:
          rundir.update_config()    # e.g. a larger --steps, recorded
          print(f'purax: resuming {rundir.path} from step {restored.step}', file=sys.stderr)
        return _fit(job, rundir, checkpointer, restored, stop)
      finally:   # a committed checkpoint keeps the directory, however the run ends
        with contextlib.suppress(Exception):
          if checkpointer.steps():
            rundir.committed()
  except PuraxError:   # this process's own, named error
    raise
  except Exception:
    # Multi-host: a lost peer may surface as any error (a collective, the
    # checkpoint's barrier as it closes); the watchdog's verdict comes first
    # (exit 75, named), before the exit's own shutdown barrier would abort.
    parallel.distributed.await_verdict()
    raise


def refit(job, rundir, error: BaseException) -> tuple[TrainConfig, int]:
  """A run on a ``--time-budget`` whose step ran out of memory, fitted again
  on its own (:func:`purax.app.fit_memory.refit_config`: the fastest
  configuration below the step that failed): the choice written into
  ``config.json`` and recorded in ``memory_refits.json``. Returns the
  config and the step the next attempt resumes from (its newest checkpoint,
  0 without one), on the same clock.

  Raises:
    OutOfMemoryError: no configuration fits below the step that failed.
  """
  config, record = fit_memory.refit_config(job.config, error,
                                           stream=sys.stderr if rundir.primary else None)
  record['resumed_from_step'] = newest_step(rundir) or 0
  if rundir.primary:
    fit_memory.record_refit(rundir.path, record)
  rundir.replace_config(config)
  changed = ', '.join(f'--{k.replace("_", "-")} {record["failed"][k]} -> {v}'
                      for k, v in record['chosen'].items() if v != record['failed'][k]
                      and k != 'peak_bytes')
  print(f'purax: out of memory ({record["error"]}); fitted again below it ({changed}; '
        f'recorded in {fit_memory.REFITS}); resuming from step {record["resumed_from_step"]}',
        file=sys.stderr)
  return config, record['resumed_from_step']


def connect(config: TrainConfig) -> TrainConfig:
  """Connects the processes of a multi-host run (a no-op for one process) and
  returns the validated, resolved config, agreed by every process.

  Raises:
    ConfigError: on every process, when any process cannot start (named).
  """
  run = config.run
  parallel.distributed.initialize(run.coordinator, run.num_processes, run.process_id,
                                  timeout_s=120)
  if jax.process_count() > 1:
    _agree_to_start(config)
  config = config.validate()
  expect(jax.process_count() == 1 or bool(config.run.workdir), 'workdir',
         'set for a multi-host run (every process must use the same directory)',
         config.run.workdir, ConfigError)
  return config.resolved()


def _start_phases(stop):
  def starting(phase: str) -> None:
    # One process only: several must agree first, which the training loop does.
    if stop() and jax.process_count() == 1:
      raise StoppedBeforeStart(stop.received, phase)
  return starting


def resume(job: job_lib.Job, rundir: rundir_lib.RunDir, checkpointer: Checkpointer
           ) -> Restored:
  """:func:`purax.restore_or_init` for a run directory: the newest readable
  checkpoint of a resumed run (an unreadable one is moved aside), else a fresh
  state; a resumed run's config is checked against the saved one.

  Raises:
    CheckpointMismatchError: the checkpoint's shapes differ from the model's.
    ConfigError: ``--steps`` below the checkpoint's step, a field that changes
      the computation differs, or a corrupt data position.
  """
  key, fresh = jax.random.key(job.config.run.seed), None
  if not rundir.resuming:
    fresh = job.init(job.config.run.seed)
  else:
    try:
      restored = restore_or_init(checkpointer, job.task, key, job.sample, plan=job.plan,
                                 hooks=job.hooks, move_aside=True)
    except CheckpointError as e:
      if isinstance(e, CheckpointMismatchError) or checkpointer.steps():
        raise    # a mismatch or a failure that is not the files': stop, with its reason
      print(f'purax: no readable checkpoint in {checkpointer.directory} (all moved '
            'aside); starting again from step 0', file=sys.stderr)
      fresh = job.init(job.config.run.seed)
  if fresh is not None:
    return Restored(fresh, None, 0, None, {})
  if restored.fresh:
    return restored
  reached = int(jax.device_get(restored.state.step))
  job.config.check_resumable(rundir.saved_config(), reached=reached)
  return restored


def _fit(job, rundir, checkpointer, restored, stop):
  """The run's :func:`purax.fit`: writers, evaluation, profiler, signals, as hooks."""
  run = job.config.run
  writer = None
  try:
    if rundir.primary:
      rundir_lib.truncate_jsonl(rundir.file('metrics.jsonl'), restored.step,
                                rollbacks=len(((restored.hook_states or {}).get(
                                    'spike_rollback') or {}).get('events', ())))
      writer = writers.create_default_writer(rundir.path, console=True,
                                             wandb_project=run.wandb_project,
                                             resume_step=restored.step)
      writers.write_run_info(writer, job.config.hparams(), job.config.to_json())
      writer = job_lib.with_throughput(writer, job)
    multihost = jax.process_count() > 1
    hooks = hooks_lib.standard(
        log_every=run.log_every, writer=writer,
        eval_data=job.data.eval(job.config.data.eval_batch_size), eval_every=run.eval_every,
        checkpointer=checkpointer, checkpoint_every=run.checkpoint_every,
        should_stop=_agreed(stop) if multihost else _after_start_up(stop),
        stop_every=run.log_every if multihost else None,
        max_consecutive_skips=job.config.optimizer.max_consecutive_skips,
        progress=run.progress and rundir.primary and progress.interactive(),
        profile=profile.parse_range(run.profile) if run.profile else None,
        profile_dir=rundir.path, profile_memory=run.profile_memory,
        replay_dir=rundir.file(replay.DIRECTORY) if rundir.primary else None,
        debug_nans=run.debug_nans)
    if run.patience:    # the rule --keep-best ranks by
      best = run.best()
      hooks.append(hooks_lib.EarlyStopping(
          metric=best.key, mode=best.mode, patience=run.patience,
          every=0 if best.key.startswith('eval') else run.log_every))
    mesh = getattr(job.plan, 'mesh', None)
    # Out of memory: on a time budget the run fits again (train), else the error names fits.
    explain = (contextlib.nullcontext() if run.time_budget is not None else
               plan_memory.explain_out_of_memory(
                   job.task, job.sample, mesh=mesh, spell=lambda c: fit_memory.flags(c, mesh),
                   **fit_memory.choices(job.config)))
    with explain, profile.memory_profile_on_oom(rundir.path):
      return fit(job.task, restored, job.train_data, steps=job.config.run.steps, plan=job.plan,
                 hooks=hooks + list(job.hooks), steps_per_call=run.steps_per_call)
  finally:
    if writer is not None:
      writer.close()


@jax.jit
def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
                           or [jnp.bool_(True)]))


def finish(job, rundir, state, history, stop, *, fitted_now: bool = False,
           planned: dict | None = None) -> dict:
  """The run's result, said once: how it ended (:class:`purax.hooks.End`),
  in ``final_metrics.json`` (a finished or early-stopped run), in
  ``verdict.json`` (a run on a ``--time-budget``, :mod:`purax.app.verdict`:
  also a stopped one) and in words on stderr with the run directory, its
  checkpoints and the next commands.

  Returns:
    The final evaluation metrics; for a stopped run ``{'stopped_by':
    SIGNAL, 'step': s}`` (a checkpoint at ``s`` committed).

  Raises:
    NonFiniteError: the params are not finite at the end (the run diverged).
  """
  reached = int(jax.device_get(state.step))
  end = history.end
  if end is None or end.status == 'stopped':
    by = stop.received or 'a signal to another process'
    status = (f' (exit status {signals.status(signal.Signals[stop.received])})'
              if stop.received else '')
    stopped = End('stopped', reached, f'a checkpoint at step {reached} is committed in '
                  f'{rundir.file("checkpoints")}; run the same command to resume{status}',
                  signal=by)
    write_verdict(job, rundir, end or stopped, {}, fitted_now, planned)
    say_end(rundir, stopped)
    return {'stopped_by': by, 'step': reached}
  if stop.received:     # e.g. during the final save: the run had ended, and is kept
    print(f'purax: {stop.received} arrived as the run ended; step {reached} is committed '
          f'(exit status {signals.status(signal.Signals[stop.received])})', file=sys.stderr)
  final = {k[len('eval/'):]: v for rec in history for k, v in rec.items()
           if k.startswith('eval/')}
  if not final:   # nothing was evaluated in this process
    final = evaluate(job.task, state, job.data.eval(job.config.data.eval_batch_size),
                     plan=job.plan)
  if not bool(jax.device_get(_all_finite(state.params))):
    raise NonFiniteError(
        f'params: expected finite values after step {reached}, got NaN or inf (the run '
        'diverged; try a lower learning rate, clipping, or --debug-nans to find the source)')
  # JSON has no NaN/inf: such values are written as strings, as in metrics.jsonl.
  final = {k: writers.json_number(v) for k, v in final.items()}
  if rundir.primary:
    rundir_lib.write_atomic(rundir.file('final_metrics.json'), json.dumps(
        {'step': reached, **final, 'status': end.status, 'end': end.as_dict()}, indent=2,
        allow_nan=False))
  write_verdict(job, rundir, end, final, fitted_now, planned)
  say_end(rundir, end)
  # A signal that came as the run ended is still answered by its status.
  return {**final, 'stopped_by': stop.received} if stop.received else final


def write_verdict(job, rundir, end: End, final: dict, fitted_now: bool,
                  planned: dict | None = None) -> None:
  """``verdict.json`` of a run on a ``--time-budget`` (:func:`purax.app.verdict.of_run`),
  written by the writer (process 0) only; nothing without a budget. ``planned``:
  what :func:`purax.app.calibrate.calibrated` measured in this invocation."""
  budget = next((h for h in job.hooks if isinstance(h, hooks_lib.TimeBudget)), None)
  if budget is None or not rundir.primary:
    return
  verdict_lib.write(rundir.file(verdict_lib.VERDICT), verdict_lib.of_run(
      job.config, end, final, budget, fitted_now=fitted_now,
      replay_dir=rundir.file(replay.DIRECTORY), compile_s=compile_time.seconds(),
      workdir=rundir.path, planned=planned))
  print(f'purax: verdict {rundir.file(verdict_lib.VERDICT)} ({budget.used():.1f} s of the '
        f'{budget.seconds:g} s budget used)', file=sys.stderr)


def say_end(rundir, end: End) -> None:
  """How the run ended, in words on stderr: the status, the run directory, its
  last and best checkpoints and the next commands (those on process 0 only)."""
  if not rundir.primary:
    print(f'purax: {end.words()}', file=sys.stderr)
    return
  path = rundir.path
  lines = [f'purax: {end.words()}']
  where = f'purax: run directory {path}'
  config = rundir.config
  with contextlib.suppress(Exception):   # what the directory holds: said when readable
    with Checkpointer(rundir.file('checkpoints'), read_only=True,
                      keep_best=config.run.keep_best or 0,
                      best_metric=config.run.best().key,
                      best_mode=config.run.best_mode) as reader:
      steps = reader.steps()
      if steps:
        where += f'; checkpoints: last {steps[-1]}'
        if config.run.keep_best:
          with contextlib.suppress(CheckpointError):
            where += f', best {reader.best_step()} (by {config.run.best().key})'
  lines.append(where)
  if end.status == 'stopped':
    lines.append(f'purax: next: purax train --workdir {path}   (resumes)')
  elif end.status in DONE:
    best = ' --best' if config.run.keep_best else ''
    lines.append(f'purax: next: purax eval --workdir {path}{best}; purax plot --workdir '
                 f'{path}; purax export --workdir {path}{best}')
  print('\n'.join(lines), file=sys.stderr)


def ended_run(job, rundir, restored: Restored) -> dict | None:
  """A resumed run that has ended and that this command would not train on:
  its newest readable checkpoint ended it ``finished`` with ``--steps`` not
  changed, or ``early_stopped`` with ``--patience`` not raised, or on a
  ``--time-budget`` at its schedule's end (``--decay-steps``, however long
  the new budget) (a run from before 0.3 recorded no end: finished when that
  checkpoint is at its steps).
  Says so and returns its final metrics (``final_metrics.json``, written anew
  from the checkpoint when it is missing or unreadable); None when there is
  training to do. ``config.json`` is left as it was."""
  if restored.fresh:
    return None
  config, saved = rundir.config, rundir.saved_config()
  try:
    end = End.from_dict(restored.extra['end']) if 'end' in restored.extra else (
        End('finished', restored.step, f'reached step {restored.step}')
        if restored.step >= saved.run.steps else None)
  except ValueError:
    end = None
  if end is None or not end.done:
    return None
  # A budget's run at its schedule's end (--decay-steps) has nothing left to train on it.
  decayed = (config.run.time_budget is not None and bool(config.run.decay_steps)
             and end.step >= config.run.decay_steps)
  if budget_lib.ended_by_budget(end) and not decayed:
    if (config.run.time_budget, config.run.steps) != (saved.run.time_budget, saved.run.steps):
      return None                      # another budget (or --steps) trains on: its own budget
  elif end.status == 'finished' and config.run.steps != end.step and not decayed:
    return None                        # a longer --steps trains on
  if end.status == 'early_stopped' and config.run.patience > saved.run.patience:
    return None                        # a larger --patience trains on
  more = (f'--steps S --decay-steps S with S above {config.run.decay_steps}, where its '
          'learning-rate schedule ended, or branch it: purax sweep --from' if decayed
          else 'another --time-budget or --steps' if budget_lib.ended_by_budget(end) else
          '--steps larger than ' + str(end.step) if end.status == 'finished' else
          f'--patience larger than {saved.run.patience}')
  if rundir.primary:
    print(f'purax: {rundir.path} has already ended: nothing to train (to train on, pass '
          f'{more})', file=sys.stderr)
  final = read_final_metrics(rundir.file('final_metrics.json'))
  if final is None:         # missing or unreadable: the writer, under its lock, writes it anew
    final = {k: writers.json_number(v) for k, v in evaluate(
        job.task, restored.state, job.data.eval(job.config.data.eval_batch_size),
        plan=job.plan).items()}
    if rundir.primary:
      print(f'purax: {rundir.file("final_metrics.json")} was missing or unreadable: written '
            f'anew from checkpoint {restored.step}', file=sys.stderr)
      rundir_lib.write_atomic(rundir.file('final_metrics.json'), json.dumps(
          {'step': end.step, **final, 'status': end.status, 'end': end.as_dict()}, indent=2,
          allow_nan=False))
  say_end(rundir, end)
  return final


def read_final_metrics(path: str) -> dict | None:
  """The metrics of a ``final_metrics.json`` (without its step and end), or None
  when it is missing or not such a file."""
  if not os.path.isfile(path):
    return None
  try:
    with rundir_lib.open_file(path, encoding='utf-8') as f:
      data = json.load(f)
  except (ValueError, OSError):
    return None
  if not isinstance(data, dict):
    return None
  return {k: v for k, v in data.items() if k not in ('step', 'status', 'end')}


def _after_start_up(stop):
  """``stop`` as the loop polls it after each call, where a signal that came
  before the first call returned (while its step was traced and compiled) is
  still start-up: :class:`StoppedBeforeStart`, nothing written."""
  polled = False

  def poll() -> bool:
    nonlocal polled
    if not polled and stop():
      raise StoppedBeforeStart(stop.received, 'compiling the first step')
    polled = True
    return stop()
  return _Named(poll, stop)


class _Named:
  """A stop poll that names the signal it saw (``received``: what
  :class:`purax.hooks.Stop` records in the run's end)."""

  def __init__(self, poll, stop):
    self.poll, self.stop = poll, stop

  @property
  def received(self) -> str | None:
    return self.stop.received

  def __call__(self) -> bool:
    return self.poll()


def _agreed(poll):
  """``poll`` (a stop flag), agreed by all processes of a multi-host run: all
  stop when any was signalled (a process that stopped alone would leave the
  others waiting in the step's collectives). Polled at the same steps on
  every process (:class:`purax.hooks.Stop` with the log cadence)."""
  def agreed() -> bool:
    return bool(np.any(multihost_utils.process_allgather(np.int32(poll()))))
  return _Named(agreed, poll)


def _agree_to_start(config: TrainConfig) -> None:
  """Multi-host: every process validates its config and loads its data, and all
  learn every answer (bounded in time) before any collective or file write.

  Raises:
    ConfigError: on every process, naming the process that cannot start and
      why, or the first field whose value differs between processes.
  """
  error = ''
  try:
    checked = config.validate()
    expect(bool(checked.run.workdir), 'workdir', 'set for a multi-host run (every process '
           'must use the same directory)', checked.run.workdir, ConfigError)
    job_lib.build(checked.resolved(), mesh=False)        # the data and the model, checked
  except Exception as e:   # any refusal: every process is told, then all stop
    error = str(e) or type(e).__name__
  per_process = ('process_id',)
  mine = {k: v for k, v in config.flat().items() if k not in per_process}
  answers = [json.loads(a) for a in parallel.distributed.agree(
      'start', json.dumps({'error': error, 'config': mine}, sort_keys=True))]
  for i, answer in enumerate(answers):
    if answer['error']:
      raise ConfigError(f'process {i} cannot start: {answer["error"]}')
  first = answers[0]['config']
  for i, answer in enumerate(answers[1:], start=1):
    for field in sorted(first):
      expect(answer['config'].get(field) == first[field], field,
             f'the same value on every process ({first[field]!r} on process 0)',
             f'{answer["config"].get(field)!r} on process {i}', ConfigError)


# -- eval, export, generate: a saved run, restored --------------------------------------


def restore_run(workdir: str, *, need_data: bool = True, best: bool = False):
  """``(job, state)`` of a run's newest readable checkpoint (or its best one);
  reads only: a trainer writing the same directory is not disturbed.

  Without ``need_data``, a run whose data file is gone is rebuilt from the
  shapes its checkpoint records (export and generate need no data; then
  ``job.data`` is None). With ``best``, the checkpoint with the best
  ``--best-metric`` among those kept (a run of ``--keep-best``).

  Raises:
    ConfigError: ``workdir`` is not a purax run directory;
    CheckpointError: it has no readable checkpoint (with ``best``: none that
      records the best metric);
    CheckpointMismatchError: the code's model differs from the checkpoint's.
  """
  config = rundir_lib.read_config(workdir).validate()
  path = datasets.lookup(config.data.name)[2]
  directory = os.path.join(workdir, 'checkpoints')
  expect(os.path.isdir(directory), 'workdir', 'a run directory with checkpoints/',
         f'{workdir!r} without one', CheckpointError)
  attempts = 0
  while True:
    try:
      return _restore_run(config, path, directory, need_data, best)
    except (CheckpointError, FileNotFoundError) as e:
      # A writer beside this reader deleted the checkpoint it had chosen
      # (keep-last): read again, from what the directory holds now.
      attempts += 1
      if attempts == READ_ATTEMPTS or not _vanished(e):
        raise


#: How often a reader reads a run again when a writer beside it deleted the
#: checkpoint the reader had chosen.
READ_ATTEMPTS = 3


def _vanished(error: BaseException) -> bool:
  """Whether ``error`` (or what caused it) is a file that went missing."""
  while error is not None:
    if isinstance(error, FileNotFoundError) or 'FileNotFoundError' in str(error):
      return True
    error = error.__cause__ or error.__context__
  return False


def _restore_run(config, path, directory, need_data, best):
  with Checkpointer(directory, read_only=True, keep_best=1, best_metric=config.run.best().key,
                    best_mode=config.run.best_mode) as ckpt:
    step = ckpt.best_step() if best else None
    shapes = None
    if not need_data and path is not None and not os.path.exists(path):
      shapes = ckpt.read_extra().get('data_shapes')
    if shapes is None:
      job = job_lib.build(config, mesh=False)
    else:
      sample = job_lib.shapes_sample(shapes, config.data.batch_size)
      task = job_lib.build_task(config, num_classes=shapes['num_classes'],
                                input_shape=tuple(shapes['x']))
      ema = config.run.ema_decay    # its arrays are in the checkpoint: restored, not used
      hooks = (hooks_lib.EMA(decay=ema, every=config.run.ema_every),) if ema else ()
      job = job_lib.Job(config, None, task, sample,
                        abstract_checkpoint(task, sample, hooks=hooks), SingleDevicePlan(task), 1,
                        shapes['num_classes'])
    tree, _, _ = ckpt.restore(job.abstract, step)
  return job, tree['state']


def evaluate_run(workdir: str, *, batch_size: int | None = None, best: bool = False,
                 with_step: bool = False):
  """Restores the newest checkpoint of a run (or its best, ``best``) and
  evaluates it on the test split; reads only.

  Returns:
    The metrics (name -> float); with ``with_step``, ``(metrics, step)``: the
    step of the checkpoint evaluated.

  Raises:
    ConfigError: ``batch_size`` < 1; DataError: the data file (which holds the
      test split) is gone.
  """
  expect(batch_size is None or 1 <= batch_size < 2 ** 31, 'batch_size', '>= 1 or unset',
         batch_size, ConfigError)
  job, state = restore_run(workdir, best=best)
  metrics = evaluate_state(job, state, batch_size)
  return (metrics, int(np.asarray(state.step).max())) if with_step else metrics


def evaluate_state(job: job_lib.Job, state, batch_size: int | None = None) -> dict:
  """The metrics of ``state`` on the job's test split (batches of ``batch_size``,
  default the run's)."""
  return evaluate(job.task, state, job.data.eval(batch_size or job.config.data.eval_batch_size))


def export_run(workdir: str, *, out: str | None = None, format: str = 'jax',  # pylint: disable=redefined-builtin
               best: bool = False) -> str:
  """Exports a run's predict function (newest checkpoint, or the best with
  ``best``) with a symbolic batch.

  Inputs are float32 ``[batch, *input_shape]``; for a language model int32
  token ids ``[batch, seq_len]`` (outputs: logits ``[batch, seq_len, 256]``).
  ``format``: ``'jax'`` (jax.export), ``'onnx'`` or ``'savedmodel'``
  (:func:`purax.io.export.export`; the last two checked against the
  in-process predict before they are written).

  Returns:
    The artifact's path (default ``WORKDIR/export/predict.jaxexport``,
    ``WORKDIR/export-onnx/predict.onnx``, ``WORKDIR/export-savedmodel``).
  """
  job, state = restore_run(workdir, need_data=False, best=best)
  tokens = job.config.model.spec.tokens
  shape = job.sample['x'].shape[1:]
  checked = {}
  if format != 'jax' and tokens:   # the check's token ids: below the vocabulary
    checked['inputs'] = np.random.default_rng(0).integers(0, job.num_classes, (7, *shape))
  return export.export(
      lambda x: job.task.predict(state, x), shape,
      out or os.path.join(workdir, 'export' if format == 'jax' else f'export-{format}'),
      format=format, dtype=jnp.int32 if tokens else jnp.float32, **checked,
      metadata={'model': job.config.model.name, 'dataset': job.config.data.name,
                'num_classes': job.num_classes, 'step': int(jax.device_get(state.step))})


def debug_nan_run(workdir: str, step: int | None = None):
  """Replays an update that a run skipped as non-finite and saved
  (``WORKDIR/nonfinite/STEP``, :class:`purax.hooks.NonFiniteReplay`), in this
  process: where its first non-finite value came from.

  Args:
    workdir: the run directory.
    step: the update's ``state.step`` (as the run reported it); default the
      only saved one (or the first).

  Returns:
    ``(replayed, saved)``: the :class:`purax.inspect.nan.Report` of this
    replay and the report the run wrote (a dict).

  Raises:
    ConfigError: ``workdir`` is not a run, or holds no saved update at ``step``
      (naming the saved steps).
  """
  config = rundir_lib.read_config(workdir).validate()
  directory = os.path.join(workdir, replay.DIRECTORY)
  steps = replay.saved_steps(directory)
  expect(bool(steps) and (step is None or step in steps), 'step',
         f'a saved update, one of {steps}' if steps else
         f'a saved update in {directory} (none: no update of this run was skipped and '
         'replayed)', step, ConfigError)
  job = job_lib.build(config, mesh=False)
  state, batch, saved = replay.load_update(directory, steps[0] if step is None else step,
                                           job.abstract['state'], job.sample)
  return nonfinite.find(job.task, state, batch), saved


#: Longest continuation ``generate`` makes (its KV cache grows with it).
MAX_NEW_TOKENS = 2 ** 16


def generate_run(workdir: str, prompt: str, *, max_new_tokens: int = 200,
                 temperature: float = 0.8, seed: int = 0) -> str:
  """Continues ``prompt`` with a trained language model's newest checkpoint.

  Greedy when ``temperature`` is 0; sampling with ``jax.random.key(seed)``
  otherwise (:func:`purax.nn.generate.generate`, jitted, KV cache).

  Returns:
    The generated text (without the prompt); invalid UTF-8 becomes U+FFFD.

  Raises:
    ConfigError: the run is not a language model (``--model lm``), or a bad
      ``max_new_tokens`` / ``temperature``; DataError: an empty prompt.
  """
  expect(len(prompt) > 0, 'prompt', 'a non-empty string', repr(prompt), DataError)
  expect(1 <= max_new_tokens <= MAX_NEW_TOKENS, 'max_new_tokens',
         f'in [1, {MAX_NEW_TOKENS}]', max_new_tokens, ConfigError)
  expect(temperature >= 0, 'temperature', '>= 0 (0: greedy)', temperature, ConfigError)
  expect(0 <= seed < 2 ** 32, 'seed', 'in [0, 2**32)', seed, ConfigError)
  config = rundir_lib.read_config(workdir)
  expect(config.model.spec.tokens, 'workdir', 'a run of --model lm',
         f'--model {config.model.name}', ConfigError)
  job, state = restore_run(workdir, need_data=False)
  tokens = generate(job.task.model, job.task.evaluation_params(state), text.encode(prompt)[None],
                    key=jax.random.key(seed), max_new_tokens=max_new_tokens,
                    temperature=temperature)
  return text.decode(jax.device_get(tokens)[0])
