"""Everything a run builds before it writes a file: data, task, plan, shapes.

:func:`build` turns a validated :class:`purax.app.config.TrainConfig` into a
:class:`Job` — the loaded data, the :class:`purax.Task`, the plan that places
and steps the state (one device, or a mesh), the abstract checkpoint tree
(traced: shapes are checked) — and refuses a language model whose step
cannot fit in memory, all before a run directory is touched. ``purax train``,
``--dry-run``, ``purax sweep``, ``eval``, ``export`` and ``generate`` share it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import purax
from purax import hooks as hooks_lib
from purax.hooks import time_budget as budget_lib
from purax import loop
from purax import parallel
from purax.plan import SingleDevicePlan
from purax.plan import budget
from purax.app import data as data_lib
from purax.app import models
from purax.app.config import TrainConfig
from purax.app.hparam_table import HPARAMS, schedule_values
from purax.app.optimizer_table import OPTIMIZERS, weight_decay_mask
from purax.core import metrics as metrics_lib
from purax.core import objectives
from purax.core.spikes import SpikeGuard
from purax.core.errors import ConfigError, expect
from purax.core.precision import get_policy
from purax.core.task import Task
from purax.inspect import flops
from purax.io.checkpoint.run import abstract_checkpoint
from purax.nn.transformer import count_params


def build_task(config: TrainConfig, *, num_classes: int, input_shape) -> Task:
  """The Task (model, the optimizer of ``--optimizer``, the data set's loss) of
  a config, checked against the data's shapes.

  Raises:
    DataError: inputs of ``input_shape`` do not suit the model.
  """
  model = models.build(config.model, num_classes=num_classes, seq_len=config.data.seq_len,
                       input_shape=input_shape)
  models.check_input_shape(model, (1, *input_shape), field='x_train')
  opt, run = config.optimizer, config.run
  spec = OPTIMIZERS[opt.name]
  total = run.decay_steps or run.steps
  values = schedule_values(opt.values(), total)
  tx = spec.transformation(values, total_steps=total, warmup_steps=min(opt.warmup_steps, total),
                           weight_decay_mask=weight_decay_mask(opt.weight_decay_mask),
                           schedule=opt.schedule)
  policy = get_policy(config.model.precision)
  loss = config.data.objective()
  if opt.z_loss:
    loss = objectives.language_model_loss(z_loss=opt.z_loss)
  return Task(model=model, tx=tx, loss=loss, hparams=loss_hparams(config, values),
              microbatches=opt.microbatches,
              loss_scale=opt.loss_scale if policy.needs_loss_scaling else None,
              eval_params=spec.eval_params,
              spike_guard=SpikeGuard(opt.spike_window, opt.spike_k) if opt.spike_k else None)


#: The hyperparameter table's rows by where they live: the optimizer's, Task.hparams.
HPARAM_ROWS = {w: tuple(r for r in HPARAMS if r.where == w) for w in ('optimizer', 'loss')}


def loss_hparams(config: TrainConfig, values: dict) -> dict[str, float]:
  """``Task.hparams``: the loss rows of the table that the loss declares
  (``--label-smoothing`` for the built-in losses; a ``--loss`` of your own
  declares its own with :func:`purax.loss_function`).

  Raises:
    ConfigError: a row set away from its default for a loss that does not declare it.
  """
  declared = config.data.loss_hparams()
  for row in HPARAM_ROWS['loss']:
    expect(row.state in declared or values[row.state] == row.default, row.field,
           f'{row.default} for --loss {config.data.loss} (it declares '
           f'{sorted(declared) or "no hyperparameter"}: purax.loss_function(hparams=...))',
           values[row.state], ConfigError)
  return {row.state: values[row.state] for row in HPARAM_ROWS['loss'] if row.state in declared}


@dataclasses.dataclass
class Job:
  """A run, built and checked, nothing written.

  Attributes:
    config: the validated, resolved config.
    data: the loaded :class:`purax.app.data.Data` (None for a saved run
      rebuilt from its recorded shapes).
    task: the :class:`purax.Task`.
    sample: a zero batch of the run's shapes ``[batch_size, ...]``.
    abstract: the abstract checkpoint tree ``{'state', 'train_metrics'}``.
    plan: the :mod:`purax.plan` plan: one device, or a mesh (``--mesh``).
    train_data: the run's training batches, random access by step (None
      for a saved run rebuilt from its recorded shapes).
    hooks: the run's :mod:`purax.hooks` (EMA, histograms); an EMA's arrays
      are part of ``abstract``.
    num_devices: devices one step runs on.
    num_classes: classes (a language model's vocabulary size).
  """

  config: TrainConfig
  data: data_lib.Data
  task: Task
  sample: dict
  abstract: dict
  plan: Any
  num_devices: int
  num_classes: int
  train_data: Any = None
  hooks: tuple = ()

  def init(self, seed: int):
    """The fresh state of ``seed``, placed as the plan wants it."""
    return self.plan.init_state(jax.random.key(seed), self.sample)

  def metadata(self) -> dict:
    """What every checkpoint records beside the arrays; with the per-example
    shapes of the data, so that export and generate need no data file."""
    return metadata(self.config, self.sample, self.num_classes)


def metadata(config: TrainConfig, sample: dict | None = None, num_classes=None) -> dict:
  """A checkpoint's metadata: the config, the versions, the processes and
  devices and the mesh (``--mesh``, None: one device) it was saved from; a
  run may resume on others (``docs/guides/device-counts.md``)."""
  meta = {'config': config.as_dict(), 'purax_version': purax.__version__,
          'jax_version': jax.__version__, 'device_count': jax.device_count(),
          'process_count': jax.process_count(), 'mesh': config.run.mesh}
  if sample is not None:
    meta['data_shapes'] = {'x': list(sample['x'].shape[1:]), 'x_dtype': str(sample['x'].dtype),
                           'y': list(sample['y'].shape[1:]), 'y_dtype': str(sample['y'].dtype),
                           'num_classes': int(num_classes)}
  return meta


def build(config: TrainConfig, *, phase: Callable[[str], None] = lambda name: None,
          mesh: bool = True) -> Job:
  """Loads the data and builds the task and plan of a validated config.

  Args:
    config: validated and resolved.
    phase: called after each phase with its name (``'loading the data'``,
      ``'tracing the model'``, ``'building the plan'``), e.g. to stop early.
    mesh: build the mesh plan when ``config.run.mesh`` is set.

  Raises:
    ConfigError, DataError: the data, the model's shapes, or the memory estimate.
  """
  data = config.data.load()
  phase('loading the data')
  task = build_task(config, num_classes=data.num_classes, input_shape=data.input_shape)
  batch_size = config.data.batch_size
  budget.expect_fits(batch_size * data.example_bytes(), 'batch_size', batch_size,
                     'a batch that', how='the inputs and targets of one batch',
                     hint='use a smaller --batch-size')      # before the sample is made
  sample = data.sample(batch_size)
  abstract = abstract_checkpoint(task, sample)     # traces the model: shapes are checked
  phase('tracing the model')
  run = config.run
  train_data = data.train(config.data.batch_size, run.seed, run.steps + skippable(config))
  plan, num_devices = SingleDevicePlan(task), 1
  if mesh and config.run.mesh is not None:
    device_mesh = parallel.make_mesh(**parallel.parse_mesh(config.run.mesh))
    plan = parallel.sharded(task, device_mesh, parallel.for_mesh(device_mesh), sample)
    num_devices = device_mesh.devices.size
  hooks = run_hooks(config, task, plan, data, train_data)
  check_rollback_memory(hooks, abstract['state'])   # before its ring's arrays exist
  if hooks:
    abstract = abstract_checkpoint(task, sample, hooks=hooks)
  job = Job(config, data, task, sample, abstract, plan, num_devices, data.num_classes,
            train_data, hooks)
  if not config.run.fit_memory:   # fit_memory measured the compiled step instead
    check_memory(job)   # before any compilation
  phase('building the plan')
  return job


def _ema(config: TrainConfig, task: Task, plan, data) -> hooks_lib.EMA:
  """The ``--ema-decay`` hook: an average of what the task evaluates
  (:meth:`purax.Task.evaluation_params`), evaluated as it is (by the task
  without ``eval_params``, on a plan of the same placement)."""
  if task.eval_params is not None:
    plain = dataclasses.replace(task, eval_params=None)
    plan, task, params_of = plan.for_task(plain), plain, task.evaluation_params
  else:
    params_of = None
  return hooks_lib.EMA(decay=config.run.ema_decay, every=config.run.ema_every,
                       params_of=params_of, evaluate=functools.partial(
                           loop.evaluate, task, batches=data.eval(config.data.eval_batch_size),
                           plan=plan))


#: Rollbacks whose skipped data steps (``--spike-action skip-data``) the
#: training data holds beyond ``--steps``; after more, the run ends when the data does.
SKIPPABLE_ROLLBACKS = 16


def skippable(config) -> int:
  """Batches beyond ``--steps`` the training data holds for the data steps that
  spike rollbacks skip (``--spike-rollback`` with ``--spike-action skip-data``),
  ``SKIPPABLE_ROLLBACKS`` rollbacks' worth; 0 otherwise. The batch of a step
  does not depend on the data's length."""
  opt = config.optimizer
  return (SKIPPABLE_ROLLBACKS * opt.spike_rollback
          if opt.spike_rollback and opt.spike_action == 'skip-data' else 0)


#: The CLI's optional hooks: the ``RunConfig`` field that turns one on (set,
#: and not 0) maps to ``(config, task, plan, data, train_data) -> hook``.
#: Adding a CLI hook is its class (a :mod:`purax.hooks` module) plus one row
#: here and its field in ``RunConfig``.
HOOKS: dict[str, Callable] = {
    'ema_decay': lambda config, task, plan, data, train_data: _ema(config, task, plan, data),
    'histograms': lambda config, task, plan, data, train_data: hooks_lib.Histograms(
        every=config.run.histograms, task=task, batch=train_data[0]),
    'time_budget': lambda config, task, plan, data, train_data: time_budget(
        config.run.time_budget, data.eval(config.data.eval_batch_size),
        last_step=config.run.decay_steps),
}


def time_budget(duration: str, eval_data, *, report_s: float = 0.0,
                last_step: int | None = None) -> hooks_lib.TimeBudget:
  """The ``--time-budget`` hook: its clock started with the process (the
  command's wall time), its final evaluation ``eval_data``; ``report_s``
  more kept for what the command writes after training (a sweep's report);
  ``last_step`` the step it ends at however much is left (the schedule's
  end, ``--decay-steps``)."""
  seconds = budget_lib.parse_duration(duration)
  return hooks_lib.TimeBudget(seconds, eval_data=eval_data, started=process_started(),
                              tail_s=max(2.0, 0.03 * seconds) + report_s, last_step=last_step)


def process_started() -> float:
  """When this process started, on ``time.monotonic``'s clock (Linux: from
  ``/proc/self/stat``; elsewhere when this module was imported)."""
  try:
    with open('/proc/self/stat', encoding='ascii') as f:
      ticks = int(f.read().rsplit(')', 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf('SC_CLK_TCK')
    return time.monotonic() - max(age, 0.0)
  except (OSError, ValueError, IndexError, AttributeError):
    return _IMPORTED


_IMPORTED = time.monotonic()


def run_hooks(config: TrainConfig, task, plan, data, train_data) -> tuple:
  """The hooks of :data:`HOOKS` that the config turns on, in the table's order."""
  return tuple(build(config, task, plan, data, train_data) for field, build in HOOKS.items()
               if getattr(config.run, field) not in (None, 0, False)) + spike_rollback(config)


def spike_rollback(config: TrainConfig) -> tuple:
  """The :class:`purax.hooks.SpikeRollback` of ``--spike-rollback`` (none when 0): it
  checks every gcd of the rollback, ``--log-every`` and the lowered steps."""
  opt = config.optimizer
  if not opt.spike_rollback:
    return ()
  lr_steps = opt.spike_lr_steps or opt.spike_rollback
  return (hooks_lib.SpikeRollback(
      opt.spike_rollback, every=math.gcd(opt.spike_rollback, config.run.log_every, lr_steps),
      action=opt.spike_action, lr_scale=opt.spike_lr_scale, lr_steps=lr_steps),)


def logged_names(job: Job) -> list[str]:
  """Every metric name a run of ``job`` logs (``train/*`` of its step,
  ``eval/*`` of its evaluation, ``eval_ema/*`` with ``--ema-decay``, the
  log point's own numbers), from the traced programs: nothing compiles."""
  train = sorted(metrics_lib.as_tree(job.abstract['train_metrics']))
  evaluated = sorted(jax.eval_shape(job.task.evaluate, job.abstract['state'], job.sample))
  names = [f'train/{k}' for k in train] + [f'eval/{k}' for k in evaluated]
  if job.config.run.ema_decay:
    names += [f'eval_ema/{k}' for k in evaluated]
  names += ['train/learning_rate', 'steps_per_sec', 'early_stopping/stale']
  return sorted(set(names))


def check_best_metric(job: Job) -> None:
  """``--best-metric`` names a metric the run logs, when ``--keep-best`` or
  ``--patience`` rank by it; checked before anything compiles.

  Raises:
    ConfigError: it is not one of :func:`logged_names` (naming the close ones).
  """
  run = job.config.run
  if not (run.keep_best or run.patience):
    return
  key, names = run.best().key, logged_names(job)
  close = difflib.get_close_matches(key, names, n=3, cutoff=0.5)
  expect(key in names, 'best_metric',
         f'a metric this run logs (did you mean {" or ".join(close)}?)' if close else
         f'a metric this run logs, one of {names}',
         repr(run.best_metric) + ('' if key == run.best_metric else f' ({key})'), ConfigError)


def state_bytes(job: Job) -> int:
  """Bytes of one state of the job (its abstract state: nothing allocated)."""
  return tree_bytes(job.abstract['state'])


def tree_bytes(tree) -> int:
  """Bytes of the arrays (or ``jax.ShapeDtypeStruct``) of ``tree``."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def check_memory(job: Job) -> None:
  """Refuses a transformer run whose activations cannot fit, before compiling."""
  config, model = job.config, job.task.model
  if not hasattr(model, 'num_heads') or config.model.spec.factory:   # purax's transformers
    return
  n = job.num_devices
  need = flops.transformer_step_bytes(
      batch=max(1, config.data.batch_size // n), seq_len=int(job.sample['x'].shape[1]),
      d_model=model.d_model, num_layers=model.num_layers, num_heads=model.num_heads,
      vocab=model.vocab_size if hasattr(model, 'vocab_size') else 0,
      bytes_per_value=jnp.dtype(model.dtype).itemsize, remat=config.model.remat,
      microbatches=config.optimizer.microbatches) + state_bytes(job) // n
  budget.expect_fits(need, 'batch_size', config.data.batch_size, 'a step that',
                     how='activations and state: purax.inspect.flops.transformer_step_bytes',
                     hint='use a smaller --batch-size or --seq-len, --microbatches, or '
                     '--remat full')


def check_population_memory(job: Job, members: int, field: str, *, seeds: int = 1) -> None:
  """Refuses a population whose states cannot fit, before it is made:
  ``members`` copies of the job's state (:func:`state_bytes`) and a batch for
  each of ``seeds`` distinct seeds (:func:`purax.plan.budget.expect_fits`).

  Raises:
    ConfigError: naming ``field`` (``members``, ``num_lrs``), the memory
      available and the memory needed.
  """
  each = state_bytes(job)
  need = members * each + seeds * job.config.data.batch_size * job.data.example_bytes()
  budget.expect_fits(need, field, members, f'a population of {members} members that',
                     how=f'{members} x {each / 2 ** 20:.2f} MiB of state, and the batches',
                     hint='use fewer members, or a smaller model')


def check_rollback_memory(hooks, state) -> None:
  """Refuses a ``--spike-rollback`` whose ring of snapshots cannot fit in host
  memory (it holds ``rollback // every`` copies of ``state``, an abstract
  state, and the checkpoint as many), before anything is allocated.

  Raises:
    ConfigError: naming ``spike_rollback``, the memory available and needed.
  """
  ring = next((h for h in hooks if isinstance(h, hooks_lib.SpikeRollback)), None)
  if ring is None:
    return
  each = tree_bytes(state)
  budget.expect_fits(ring.slots * each, 'spike_rollback', ring.steps,
                     f'a ring of {ring.slots} snapshots of the state (one every {ring.every} '
                     'steps) that', how=f'{ring.slots} x {each / 2 ** 20:.2f} MiB',
                     hint='roll back fewer steps, or check at a larger --log-every',
                     device=jax.devices('cpu')[0])


def with_throughput(writer, job: Job):
  """Adds tokens/s and MFU (:mod:`purax.inspect.flops`) to the logs of a language model."""
  if not job.config.data.spec.tokens:
    return writer
  model = job.task.model
  per_token = flops.flops_per_token(
      count_params(job.abstract['state'].params), num_layers=model.num_layers,
      d_model=model.d_model, seq_len=job.config.data.seq_len)
  return flops.ThroughputWriter(
      writer, tokens_per_step=job.config.data.batch_size * job.config.data.seq_len,
      flops_per_tok=per_token, device_kind=jax.devices()[0].device_kind, dtype=model.dtype,
      num_devices=job.num_devices)


def shapes_sample(shapes: dict, batch_size: int) -> dict[str, np.ndarray]:
  """The zero batch a checkpoint's recorded ``data_shapes`` describe."""
  return data_lib.sample_batch(shapes['x'], shapes['x_dtype'], shapes['y'], shapes['y_dtype'],
                               batch_size)
