"""A whole run from a config: validate, load, build, train or resume, save.

Everything that can be wrong with the input is checked before a directory is
created or anything is compiled, so a bad run leaves nothing behind. A run
directory that exists is resumed from its newest committed checkpoint, with
the same data order and randomness (batches are random access by step and the
step key is ``fold_in(rng, step)``). SIGTERM and SIGINT finish the current
step, save, wait for the commit and return normally.

One run at a time per directory: a run holds ``WORKDIR/.purax.lock`` (an
``flock``, released by the kernel when the process dies, so a stale lock is
taken over safely); a second run is refused at once, naming the holder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import json
import os
import shutil
import signal
import socket
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import purax
from purax import parallel
from purax.config import TrainConfig, build_task, sample_batch
from purax.dry_run import print_summary
from purax.core import flops, objectives
from purax.core.errors import ConfigError, expect
from purax.io import datasets, pipeline, text, writers
from purax.io import progress as progress_lib
from purax.io import profile
from purax.io.checkpoint import Checkpointer, CheckpointError, CheckpointMismatchError
from purax.io.resume import abstract_checkpoint
from purax.loop import StopOnSignal, evaluate, fit
from purax.nn.transformer import count_params


def _prepare(config: TrainConfig):
  config = config.validate().resolved()
  if text.is_text(config.dataset):     # byte-level language modelling (--model lm)
    ds = text.load(config.dataset, seq_len=config.seq_len)
    task = build_task(config, num_classes=ds.num_classes, input_shape=ds.input_shape)
    train_data = text.train_dataset(ds, batch_size=config.batch_size, seed=config.seed,
                                    num_steps=config.steps)
    return config, ds, task, train_data
  ds = datasets.load(config.dataset, num_classes=config.num_classes)
  task = build_task(config, num_classes=ds.num_classes, input_shape=ds.input_shape)
  train_data = pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=config.batch_size,
                                      seed=config.seed, num_steps=config.steps)
  return config, ds, task, train_data


def _with_throughput(writer, config: TrainConfig, task, abstract, num_devices: int):
  """Adds tokens/s and MFU (purax.core.flops) to the logs of a language model
  whose step runs on ``num_devices`` devices (1 without a mesh)."""
  if task.loss is not objectives.language_model:
    return writer
  model = task.model
  per_token = flops.flops_per_token(
      count_params(abstract['state'].params), num_layers=model.num_layers,
      d_model=model.d_model, seq_len=config.seq_len)
  return flops.ThroughputWriter(writer, tokens_per_step=config.batch_size * config.seq_len,
                                flops_per_tok=per_token,
                                device_kind=jax.devices()[0].device_kind,
                                dtype=model.dtype, num_devices=num_devices)


def available_bytes(device) -> int | None:
  """Memory the step may use on ``device``: the accelerator's limit, or on a
  CPU the host's available memory (None when unknown)."""
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  if stats and stats.get('bytes_limit'):
    return int(stats['bytes_limit'])
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:    # not Linux: no estimate, no refusal
    return None
  return None


def _check_memory(config: TrainConfig, task, abstract, sample, num_devices: int) -> None:
  """Refuses a transformer run whose activations cannot fit, before compiling."""
  if config.model not in ('lm', 'transformer'):
    return
  model = task.model
  state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract['state']))
  need = flops.transformer_step_bytes(
      batch=max(1, config.batch_size // num_devices), seq_len=int(sample['x'].shape[1]),
      d_model=model.d_model, num_layers=model.num_layers, num_heads=model.num_heads,
      vocab=model.vocab_size if config.model == 'lm' else 0,
      bytes_per_value=jnp.dtype(model.dtype).itemsize, remat=config.remat,
      microbatches=config.microbatches) + state_bytes // num_devices
  have = available_bytes(jax.devices()[0])
  expect(have is None or need <= have, 'batch_size',
         f'a step that fits the {have / 2**30:.1f} GiB available on {jax.devices()[0].device_kind} '
         '(use a smaller --batch-size or --seq-len, --microbatches, or --remat full)',
         f'{config.batch_size}, estimated to need {need / 2**30:.1f} GiB of activations and '
         'state (purax.core.flops.transformer_step_bytes)', ConfigError)


def _metadata(config: TrainConfig, sample: dict | None = None, num_classes=None) -> dict:
  """What every checkpoint records beside the arrays; with the per-example
  shapes of the data, so that export and generate need no data file."""
  meta = {'config': dataclasses.asdict(config), 'purax_version': purax.__version__,
          'jax_version': jax.__version__, 'device_count': jax.device_count(),
          'process_count': jax.process_count(), 'mesh': None}
  if sample is not None:
    meta['data_shapes'] = {'x': list(sample['x'].shape[1:]), 'x_dtype': str(sample['x'].dtype),
                           'y': list(sample['y'].shape[1:]), 'y_dtype': str(sample['y'].dtype),
                           'num_classes': int(num_classes)}
  return meta


def _read_config(workdir: str) -> TrainConfig:
  path = os.path.join(workdir, 'config.json')
  expect(os.path.isfile(path), 'workdir', 'a run directory with config.json',
         repr(workdir), ConfigError)
  with open(path) as f:
    return TrainConfig.from_json(f.read())


def _truncate_jsonl(path: str, last_step: int) -> None:
  """Drops records written after ``last_step`` (they are recomputed on resume)."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = [l for l in f if l.strip()]
  keep = []
  for line in lines:
    try:
      if json.loads(line)['step'] <= last_step:
        keep.append(line)
    except (ValueError, KeyError):
      pass   # a line torn by a kill
  with open(path + '.tmp', 'w') as f:
    f.writelines(keep)
  os.replace(path + '.tmp', path)


LOCK_NAME = '.purax.lock'


class WorkdirLock:
  """An exclusive ``flock`` on ``WORKDIR/.purax.lock`` holding ``{pid, host, since}``.

  The kernel releases it when the holder exits or dies (even by SIGKILL), so
  a lock file left by a dead run is simply taken over; the file is never
  deleted (deleting a lock file races with a process about to lock it).

  Raises:
    ConfigError: another live process holds it (named: pid, host, since).
  """

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK_NAME)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      try:
        holder = json.loads(os.pread(fd, 4096, 0) or b'{}')
      except ValueError:
        holder = {}
      os.close(fd)
      raise ConfigError(
          f'workdir: expected no other run using {workdir}, got one: process '
          f'{holder.get("pid", "?")} on host {holder.get("host", "?")} holds {self.path} '
          f'(since {holder.get("since", "?")}); wait for it to end or stop it') from e
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({'pid': os.getpid(), 'host': socket.gethostname(),
                              'since': time.strftime('%Y-%m-%dT%H:%M:%S%z')}).encode(), 0)
    self._fd = fd

  def release(self) -> None:
    if self._fd is not None:
      os.close(self._fd)   # releases the flock
      self._fd = None


class StoppedBeforeStart(Exception):
  """A SIGTERM/SIGINT arrived during start-up (loading, tracing), before anything
  was written; ``status`` is the documented exit status (128 + signal number)."""

  def __init__(self, signame: str, phase: str):
    self.signame, self.status = signame, 128 + int(signal.Signals[signame])
    super().__init__(f'stopped by {signame} during start-up ({phase}); nothing written')


def train(config: TrainConfig) -> dict:
  """Runs ``config`` end to end, or resumes it; returns the final evaluation metrics.

  Writes ``WORKDIR/config.json``, ``metrics.jsonl``, TensorBoard events,
  ``checkpoints/`` and ``final_metrics.json``. When stopped by SIGTERM/SIGINT
  it returns ``{'stopped_by': SIGNAL, 'step': s}`` after committing a
  checkpoint at step ``s``.

  Raises:
    ConfigError, DataError: before anything is written (also when a resumed
    run's config differs in a field that changes the computation);
    FileExistsError: ``workdir`` exists but is not a purax run directory;
    CheckpointError: a checkpoint cannot be written or read.
  """
  # Connect first (a no-op for one process), so that every process's
  # validation is told to all before any collective can wait for a process
  # that refused to start.
  parallel.distributed.initialize(config.coordinator, config.num_processes,
                                  config.process_id, timeout_s=120)
  if jax.process_count() > 1:
    _agree_to_start(config)
  config = config.validate()
  expect(jax.process_count() == 1 or bool(config.workdir), 'workdir',
         'set for a multi-host run (every process must use the same directory)',
         config.workdir, ConfigError)
  config = config.resolved()
  held = {}    # process 0's WorkdirLock, released when the run ends however it ends
  try:
    # From here a first SIGTERM/SIGINT only sets a flag: start-up stops at
    # its next phase boundary (nothing written), training at the next step
    # (a checkpoint committed).
    with StopOnSignal() as stop:
      return _train(config, held, stop)
  finally:
    if 'lock' in held:
      held['lock'].release()


def _train(config: TrainConfig, held: dict, stop: StopOnSignal) -> dict:
  workdir = config.workdir

  def starting(phase: str) -> None:
    # One process only: several must agree first, which the training loop does.
    if stop() and jax.process_count() == 1:
      raise StoppedBeforeStart(stop.received, phase)

  # Multi-host: process 0 checks the workdir and every process learns its
  # answer before anything is written; then only process 0 writes files, and
  # all take part in checkpoints.
  primary = jax.process_index() == 0
  created = not os.path.exists(workdir)
  # An existing directory is locked now: a second run on it stops here.
  resuming = bool(_decide_on_primary(lambda: _check_workdir(config, held, create=False)))
  starting('checking the run directory')
  config, ds, task, train_data = _prepare(config)
  starting('loading the data')
  sample = sample_batch(ds.x_train, ds.y_train, config.batch_size)
  abstract = abstract_checkpoint(task, sample)     # traces the model: shapes are checked
  starting('tracing the model')
  plan, num_devices = None, 1          # without a mesh the step runs on one device
  if config.mesh is not None:
    mesh = parallel.make_mesh(**parallel.parse_mesh(config.mesh))
    plan = parallel.sharded(task, mesh, parallel.for_mesh(mesh), sample)
    num_devices = mesh.devices.size
  _check_memory(config, task, abstract, sample, num_devices)   # before any compilation
  starting('building the plan')
  if primary:
    print_summary(abstract['state'], shardings=plan and plan.state_sharding)
  if not resuming:   # everything is checked: create (if new), lock, check again
    _decide_on_primary(lambda: _check_workdir(config, held, create=True))
  if primary:
    print(f'purax: run directory {workdir}', file=sys.stderr)
  checkpointer = writer = None
  try:
    if not resuming and primary:
      with open(os.path.join(workdir, 'config.json.tmp'), 'w') as f:
        f.write(config.to_json())
      os.replace(os.path.join(workdir, 'config.json.tmp'), os.path.join(workdir, 'config.json'))
    checkpointer = Checkpointer(os.path.join(workdir, 'checkpoints'),
                                keep_last=config.keep_last, keep_best=config.keep_best,
                                metadata=_metadata(config, sample, ds.num_classes))
    acc = restored = None
    if resuming and checkpointer.steps():
      # An unreadable newest checkpoint is moved aside (kept for inspection),
      # so the run can save that step again.
      try:
        restored = checkpointer.restore(abstract, move_aside=True)
      except CheckpointError as e:
        if isinstance(e, CheckpointMismatchError) or checkpointer.steps():
          raise    # a mismatch or a failure that is not the files': stop, with its reason
        print(f'purax: no readable checkpoint in {checkpointer.directory} (all moved '
              'aside); starting again from step 0', file=sys.stderr)
    if restored is not None:
      tree, extra, step = restored
      state, acc = tree['state'], tree['train_metrics']
      expect(extra['data']['next_step'] == int(jax.device_get(state.step)),
             'checkpoint data position',
             f'next_step == state.step ({int(jax.device_get(state.step))}) in checkpoint {step}',
             extra['data']['next_step'], ConfigError)
      print(f'purax: resuming {workdir} from step {step}', file=sys.stderr)
    else:
      step = 0
      init = plan.init if plan is not None else lambda k: jax.jit(task.init)(k, sample)
      state = init(jax.random.key(config.seed))
    if primary:
      _truncate_jsonl(os.path.join(workdir, 'metrics.jsonl'), step)
      writer = writers.create_default_writer(workdir, console=True,
                                             wandb_project=config.wandb_project,
                                             resume_step=step)
      writers.write_run_info(writer, dataclasses.asdict(config), config.to_json())
      writer = _with_throughput(writer, config, task, abstract, num_devices)
    eval_data = pipeline.eval_batches(ds.x_test, ds.y_test, batch_size=config.eval_batch_size)
    with jax.debug_nans(config.debug_nans), \
        profile.run_profiler(workdir, config.profile, step,
                             memory=config.profile_memory) as profiler:
      state, history = fit(task, state, train_data, eval_data=eval_data,
                           log_every=config.log_every, eval_every=config.eval_every,
                           writer=writer,
                           progress=config.progress and primary and progress_lib.interactive(),
                           checkpointer=checkpointer,
                           checkpoint_every=config.checkpoint_every, train_metrics=acc,
                           should_stop=profiler(_agreed(stop, every=config.log_every)),
                           plan=plan,
                           max_consecutive_skips=config.max_consecutive_skips,
                           steps_per_call=config.steps_per_call)
  except BaseException:
    if checkpointer is not None:
      with contextlib.suppress(Exception):
        checkpointer.close()
    if not resuming and primary and (checkpointer is None or not checkpointer.steps()):
      # A new or empty directory, nothing worth keeping written: leave it as found.
      if created:
        shutil.rmtree(workdir, ignore_errors=True)
      else:
        for name in os.listdir(workdir):
          path = os.path.join(workdir, name)
          if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
          else:
            with contextlib.suppress(OSError):
              os.remove(path)
    raise
  finally:
    if writer is not None:
      writer.close()
  checkpointer.close()
  reached = int(jax.device_get(state.step))
  if reached < config.steps:
    by = stop.received or 'a signal to another process'
    print(f'purax: stopped by {by} at step {reached}; checkpoint committed in '
          f'{checkpointer.directory}; run the same command to resume', file=sys.stderr)
    return {'stopped_by': by, 'step': reached}
  final = {k[len('eval/'):]: v for rec in history for k, v in rec.items()
           if k.startswith('eval/')}
  if not final:   # resumed a run that had already finished
    final = evaluate(task, state, eval_data)
  finite = jax.jit(lambda p: jnp.all(jnp.stack(
      [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(p)] or [jnp.bool_(True)])))
  if not bool(jax.device_get(finite(state.params))):
    from purax.core.errors import NonFiniteError
    raise NonFiniteError(
        f'params: expected finite values after step {reached}, got NaN or inf (the run '
        'diverged; try a lower learning rate, clipping, or --debug-nans to find the source)')
  # JSON has no NaN/inf: such values are written as strings, as in metrics.jsonl.
  final = {k: writers._number(v) for k, v in final.items()}
  if primary:
    with open(os.path.join(workdir, 'final_metrics.json.tmp'), 'w') as f:
      json.dump({'step': config.steps, **final}, f, indent=2, allow_nan=False)
    os.replace(os.path.join(workdir, 'final_metrics.json.tmp'),
               os.path.join(workdir, 'final_metrics.json'))
  return final


def _agreed(poll, *, every: int):
  """``poll`` (a stop flag), agreed by all processes of a multi-host run.

  Every process asks at the same steps, every ``every`` calls, and all stop
  when any was signalled: a process that stopped alone would leave the others
  waiting in the step's collectives. One process: ``poll`` itself, every call.
  """
  if jax.process_count() == 1:
    return poll
  from jax.experimental import multihost_utils
  calls = itertools.count(1)

  def agreed() -> bool:
    if next(calls) % every:
      return False
    return bool(np.any(multihost_utils.process_allgather(np.int32(poll()))))
  return agreed


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
    expect(bool(checked.workdir), 'workdir', 'set for a multi-host run (every process '
           'must use the same directory)', checked.workdir, ConfigError)
    _prepare(checked.resolved())        # the data and the model, checked
  except Exception as e:   # any refusal: every process is told, then all stop
    error = str(e) or type(e).__name__
  per_process = ('process_id',)
  mine = {k: v for k, v in dataclasses.asdict(config).items() if k not in per_process}
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


def _decide_on_primary(decide) -> int:
  """``decide()`` on process 0, its int answer given to every process.

  So that all go on, or all fail, together: an exception on process 0 is
  raised there, and on the others as a ConfigError that points to its log.
  """
  error, answer = None, 0
  if jax.process_index() == 0:
    try:
      answer = int(decide())
    except Exception as e:   # any refusal: told to the other processes, then raised
      error = e
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    got = int(multihost_utils.broadcast_one_to_all(
        np.int32(-1 if error is not None else answer)))
    expect(error is not None or got != -1, 'workdir',
           'a directory process 0 accepts (its log names what it refused)', 'a refusal',
           ConfigError)
    answer = got
  if error is not None:
    raise error
  return answer


def _check_workdir(config: TrainConfig, held: dict, *, create: bool) -> bool:
  """Whether ``config.workdir`` holds a run to resume (checked against it).

  Locks the directory (``held['lock']``) once it exists and is a purax run or
  empty; with ``create``, creates it first. Only process 0 calls this.

  Raises:
    FileExistsError: the directory is neither new, empty, nor a purax run;
    ConfigError: another run holds the directory; or the saved run's config
      differs in a field that changes the computation.
  """
  workdir = config.workdir
  expect(not os.path.exists(workdir) or os.path.isdir(workdir), 'workdir',
         'a directory (new, empty, or a purax run to resume)',
         f'{workdir!r}, an existing file', FileExistsError)
  # Unwritable paths are refused here, before data is loaded or anything compiled.
  ancestor = os.path.abspath(workdir)
  while not os.path.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  expect(os.path.isdir(ancestor) and os.access(ancestor, os.W_OK | os.X_OK), 'workdir',
         'a directory this process can write (or create)',
         f'{workdir!r} ({ancestor!r} is not writable)' if ancestor != os.path.abspath(workdir)
         else f'{workdir!r}, not writable', ConfigError)
  if create:
    try:
      os.makedirs(workdir, exist_ok=True)
    except OSError as e:
      raise ConfigError(f'workdir: expected a directory that can be created, got '
                        f'{workdir!r} ({e.strerror})') from e

  def check() -> bool:
    resuming = os.path.isfile(os.path.join(workdir, 'config.json'))
    if not resuming:
      expect(not os.path.exists(workdir) or not set(os.listdir(workdir)) - {LOCK_NAME},
             'workdir', 'a new or empty directory, or a purax run directory to resume',
             repr(workdir), FileExistsError)
    return resuming

  check()                        # refuse a foreign directory before writing a lock into it
  if 'lock' not in held and os.path.isdir(workdir):
    held['lock'] = WorkdirLock(workdir)
  resuming = check()             # again under the lock: another run may have written
  expect(not (create and resuming), 'workdir',
         'still new or empty when this run was ready to start',
         f'{workdir!r}, where another run wrote meanwhile (run again to resume it)', ConfigError)
  if resuming:
    config.check_resumable(_read_config(workdir))
  return resuming


def restore_run(workdir: str):
  """``(config, dataset, task, state)`` of a run's newest readable checkpoint.

  Raises:
    ConfigError: ``workdir`` is not a purax run directory;
    CheckpointError: it has no readable checkpoint;
    CheckpointMismatchError: the code's model differs from the checkpoint's.
  """
  config, ds, task, state, _, _ = _restore(workdir, need_data=True)
  return config, ds, task, state


def _data_file(dataset: str) -> str | None:
  for prefix in ('npz:', 'text:'):
    if dataset.startswith(prefix):
      return dataset[len(prefix):]
  return dataset if dataset.endswith('.npz') else None


def _restore(workdir: str, *, need_data: bool):
  """``(config, dataset or None, task, state, sample batch, num_classes)`` of the
  newest checkpoint.

  Without ``need_data``, a run whose data file is gone is rebuilt from the
  shapes its checkpoint records (export and generate need no data).
  """
  config = _read_config(workdir)
  path = _data_file(config.dataset)
  with Checkpointer(os.path.join(workdir, 'checkpoints')) as ckpt:
    shapes = None
    if not need_data and path is not None and not os.path.exists(path):
      shapes = ckpt.read_extra().get('data_shapes')
    if shapes is None:
      config, ds, task, _ = _prepare(config)
      sample = sample_batch(ds.x_train, ds.y_train, config.batch_size)
      num_classes = ds.num_classes
    else:
      ds, num_classes = None, shapes['num_classes']
      config = config.validate()
      task = build_task(config, num_classes=shapes['num_classes'],
                        input_shape=tuple(shapes['x']))
      sample = {'x': np.zeros((config.batch_size, *shapes['x']), shapes['x_dtype']),
                'y': np.zeros((config.batch_size, *shapes['y']), shapes['y_dtype'])}
    tree, _, _ = ckpt.restore(abstract_checkpoint(task, sample))
  return config, ds, task, tree['state'], sample, num_classes


def evaluate_run(workdir: str, *, batch_size: int | None = None) -> dict:
  """Restores the newest checkpoint of a run and evaluates it on the test split.

  Raises:
    ConfigError: ``batch_size`` < 1; DataError: the data file (which holds the
      test split) is gone.
  """
  expect(batch_size is None or 1 <= batch_size < 2 ** 31, 'batch_size', '>= 1 or unset',
         batch_size, ConfigError)
  config, ds, task, state = restore_run(workdir)
  batches = pipeline.eval_batches(ds.x_test, ds.y_test,
                                  batch_size=batch_size or config.eval_batch_size)
  return evaluate(task, state, batches)


def export_run(workdir: str, *, out: str | None = None, format: str = 'jax') -> str:
  """Exports a run's predict function (newest checkpoint) with a symbolic batch.

  Inputs are float32 ``[batch, *input_shape]``; for a language model int32
  token ids ``[batch, seq_len]`` (outputs: logits ``[batch, seq_len, 256]``).
  ``format``: ``'jax'`` (jax.export), ``'onnx'`` or ``'savedmodel'``
  (:func:`purax.io.export.export`; the last two checked against the
  in-process predict before they are written).

  Returns:
    The artifact's path (default ``WORKDIR/export/predict.jaxexport``,
    ``WORKDIR/export-onnx/predict.onnx``, ``WORKDIR/export-savedmodel``).
  """
  from purax.io.export import export
  config, _, task, state, sample, num_classes = _restore(workdir, need_data=False)
  # A language model takes int32 token ids [batch, seq_len] and gives logits
  # [batch, seq_len, vocab]; the other models take float32 features.
  dtype = jnp.int32 if config.model == 'lm' else jnp.float32
  shape = sample['x'].shape[1:]
  checked = {}
  if format != 'jax' and config.model == 'lm':   # the check's token ids: below the vocabulary
    checked['inputs'] = np.random.default_rng(0).integers(0, 256, (7, *shape))
  return export(lambda x: task.predict(state, x), shape,
                out or os.path.join(workdir, 'export' if format == 'jax' else f'export-{format}'),
                format=format, dtype=dtype, **checked,
                metadata={'model': config.model, 'dataset': config.dataset,
                          'num_classes': num_classes, 'step': int(jax.device_get(state.step))})


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
  from purax.core.errors import DataError
  from purax.nn.generate import generate
  expect(len(prompt) > 0, 'prompt', 'a non-empty string', repr(prompt), DataError)
  expect(1 <= max_new_tokens <= MAX_NEW_TOKENS, 'max_new_tokens',
         f'in [1, {MAX_NEW_TOKENS}]', max_new_tokens, ConfigError)
  expect(temperature >= 0, 'temperature', '>= 0 (0: greedy)', temperature, ConfigError)
  expect(0 <= seed < 2 ** 32, 'seed', 'in [0, 2**32)', seed, ConfigError)
  config = _read_config(workdir)
  expect(config.model == 'lm', 'workdir', 'a run of --model lm', f'--model {config.model}',
         ConfigError)
  _, _, task, state, _, _ = _restore(workdir, need_data=False)
  tokens = generate(task.model, state.params, text.encode(prompt)[None],
                    key=jax.random.key(seed), max_new_tokens=max_new_tokens,
                    temperature=temperature)
  return text.decode(jax.device_get(tokens)[0])
