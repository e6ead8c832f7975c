"""``purax sweep --from RUN[:STEP]``: a sweep whose members branch from one
``purax train`` run's checkpoint instead of starting from scratch.

:func:`open_parent` finds the run and the checkpoint (its newest, or
``STEP`` when it is kept) and reads nothing but its config and the
checkpoint's JSON; :func:`inherit` gives the sweep the parent's model, data,
optimizer settings, seed and hyperparameters wherever the sweep's options
are left at their defaults, and refuses one that is set to another value
than the parent's (naming it); :func:`population` restores the parent's
state and forks it (:func:`purax.fork`) into the members; :func:`lineage`
is what the sweep records of its parent (``WORKDIR/lineage.json``). Member
``i`` computes what the parent, resumed alone with member ``i``'s
hyperparameters and trained to the sweep's ``--steps``, computes (the
schedule spans ``--steps``, as a run resumed with a larger ``--steps``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import jax

from purax.app import config as config_lib
from purax.app import fields as fields_lib
from purax.app import hparam_table as hparams_lib
from purax.app import job as job_lib
from purax.app.search import parse_seeds
from purax.app.sweep_config import SweepConfig
from purax.core.branching import fork
from purax.core.errors import CheckpointMismatchError, ConfigError, expect
from purax.io.checkpoint import Checkpointer, CheckpointError
from purax.io.safe_files import open_file

#: The file of a forked sweep's lineage (:func:`lineage`), beside its config.
LINEAGE = 'lineage.json'


@dataclasses.dataclass(frozen=True)
class Parent:
  """The run a sweep branches from.

  Attributes:
    workdir: its run directory (absolute).
    step: the checkpoint's step (the branch point).
    config: its :class:`purax.app.config.TrainConfig`.
    sha256: the SHA-256 of the checkpoint's JSON, which records a fingerprint
      of every array (:mod:`purax.io.checkpoint.integrity`): its identity.
    state: its state at ``step``, restored by :func:`open_parent` as soon as
      the step was chosen (a run that trains on deletes its older checkpoints);
      None for a parent made by hand (:func:`population` restores it then).
  """

  workdir: str
  step: int
  config: Any
  sha256: str
  state: Any = dataclasses.field(default=None, repr=False, compare=False)


#: Times :func:`open_parent` takes a training run's newest checkpoint again
#: when the one it chose was deleted (the run's ``--keep-last``) as it read it.
RETRIES = 5


def parse_from(text: str) -> tuple[str, int | None]:
  """``RUN[:STEP]`` -> ``(RUN, STEP or None)`` (a tail of digits after the last
  ``:``, unless ``text`` itself is a directory: a run named ``exp:12`` is that run).

  Raises:
    ConfigError: an empty RUN, naming ``--from``.
  """
  workdir, step = text, None
  head, sep, tail = text.rpartition(':')
  if sep and tail.isdigit() and not os.path.isdir(text):
    workdir, step = head, int(tail)
  expect(bool(workdir), '--from', 'RUN or RUN:STEP (a purax train run directory and one of '
         'its kept checkpoints)', repr(text), ConfigError)
  return workdir, step


def recorded(workdir: str | None) -> dict | None:
  """The lineage a sweep directory recorded (:func:`lineage`), or None (a new
  sweep, or one killed before it wrote its lineage: it has no checkpoint).

  Raises:
    ConfigError: ``lineage.json`` cannot be read or is not a lineage (an
      object with an integer ``step`` and a ``checkpoint_sha256``); or it is
      missing from a sweep with checkpoints (its branch point cannot be told
      again); each naming ``lineage.json``.
  """
  if not workdir:
    return None
  path = os.path.join(workdir, LINEAGE)
  expected = ("the lineage this fork recorded when it started ({'step': int, "
              "'checkpoint_sha256': str, ...})")
  if not os.path.lexists(path):
    saved = os.path.join(workdir, 'checkpoints')
    kept = sorted(int(n) for n in (os.listdir(saved) if os.path.isdir(saved) else ())
                  if n.isdigit())
    expect(not kept, LINEAGE, expected, f'none in {workdir!r}, whose checkpoints {kept} '
           'branch from it (restore the file, or start the fork in a new --workdir)',
           ConfigError)
    return None
  try:
    with open_file(path, 'rb') as f:
      text = f.read().decode('utf-8')
    data = json.loads(text)
  except UnicodeDecodeError as e:
    raise ConfigError(f'{LINEAGE}: expected {expected}, got bytes that are not UTF-8 ({e})'
                      ) from None
  except (OSError, json.JSONDecodeError) as e:
    raise ConfigError(f'{LINEAGE}: expected {expected}, got unreadable text ({e})') from None
  ok = (isinstance(data, dict) and type(data.get('step')) is int and data['step'] >= 0
        and isinstance(data.get('checkpoint_sha256'), str))
  expect(ok, LINEAGE, expected, repr(data)[:200] if isinstance(data, dict)
         else type(data).__name__, ConfigError)
  return data


def open_parent(text: str, lineage: dict | None = None) -> Parent:
  """The run and checkpoint of ``--from RUN[:STEP]``, its state restored
  (read-only: the run may be training; a newest checkpoint that it deletes
  as this reads it is taken again at the run's newest, up to :data:`RETRIES` times).

  Args:
    text: ``RUN`` (its newest checkpoint) or ``RUN:STEP``.
    lineage: what the sweep recorded when it started (:func:`recorded`): a
      resumed sweep branches from that step, whatever RUN's newest is now,
      and that checkpoint must be the one it recorded (its SHA-256).

  Raises:
    ConfigError: RUN is not a ``purax train`` run directory (no
      ``config.json``), or has no checkpoint; STEP is not among the
      checkpoints it keeps (naming them); the checkpoint's JSON is unreadable;
      its data position skips steps (a rollback's ``skip-data`` offset);
      a resumed sweep's parent checkpoint is gone or another one.
    CheckpointMismatchError: the checkpoint's state is not of the run's config.
  """
  workdir, named = parse_from(text)
  if lineage is not None:
    named = int(lineage['step'])
  expect(os.path.isfile(os.path.join(workdir, config_lib.CONFIG)), '--from',
         'a purax train run directory (with config.json)', repr(workdir), ConfigError)
  parent_config = config_lib.read_config(workdir).validate()
  abstract = job_lib.build(parent_config, mesh=False).abstract
  directory = os.path.join(workdir, 'checkpoints')
  with Checkpointer(directory, read_only=True) as ckpt:
    for attempt in range(RETRIES):
      kept = ckpt.steps() if os.path.isdir(directory) else []
      expect(bool(kept), '--from', 'a run with a committed checkpoint', f'{workdir!r} with none',
             ConfigError)
      expect(named is None or named in kept, '--from', f'a step the run keeps, one of {kept}',
             f'{text!r} (step {named})', ConfigError)
      step = kept[-1] if named is None else named
      try:
        tree, extra, _ = ckpt.restore(abstract, step)
        sha = extra['sha256']
        break
      except CheckpointMismatchError:
        raise
      except (CheckpointError, KeyError) as e:
        gone = step not in (ckpt.steps() if os.path.isdir(directory) else [])
        if named is None and gone and attempt + 1 < RETRIES:
          continue        # the training run saved on and deleted it: its newest now
        raise ConfigError(f'--from: expected a readable checkpoint, got step {step} of '
                          f'{workdir!r}: {e}') from e
  offset = int((extra.get('data') or {}).get('offset', 0))
  expect(offset == 0, '--from', 'a run whose data position skips no steps (offset 0: a fork '
         'reads the batches of its steps)', f'{workdir!r} step {step} at data offset {offset} '
         '(its --spike-rollback skipped data; fork from a step before its first rollback)',
         ConfigError)
  expect(lineage is None or lineage.get('checkpoint_sha256') == sha, '--from',
         f"checkpoint {step} of {workdir!r} as this sweep recorded it when it started "
         f"(SHA-256 {(lineage or {}).get('checkpoint_sha256')})", f'another one (SHA-256 {sha})',
         ConfigError)
  return Parent(os.path.abspath(workdir), int(step), parent_config, sha, tree['state'])


def _merge(section: str, mine, default, parents):
  """``mine`` with each field left at ``default``'s value taken from
  ``parents``; a field set to another value than the parent's (and that
  changes the computation) is refused."""
  changes = {}
  for item in dataclasses.fields(mine):
    if not hasattr(parents, item.name):
      continue
    value, theirs = getattr(mine, item.name), getattr(parents, item.name)
    if value == getattr(default, item.name):
      changes[item.name] = theirs
    else:
      expect(value == theirs or not fields_lib.changes_computation(item),
             config_lib._flag(section, item.name),
             f'{theirs!r}, the parent run\'s value (a fork continues its model, data and '
             'optimizer; leave the option out to take it)', repr(value), ConfigError)
  return dataclasses.replace(mine, **changes)


def inherit(config, parent: Parent):
  """The sweep ``config`` with the parent's model, data, optimizer settings,
  seed and hyperparameters wherever ``config`` leaves them at their defaults
  (a hyperparameter spec set, e.g. ``--lr 1e-3,3e-4``, is the sweep's);
  the parent's ``--spike-rollback`` and its action are not inherited (a
  population has no rollback), its spike guard is.
  A parent trained with ``--schedule wsd`` forks with its schedule: the
  cooldown starts at the branch point (``--decay-start`` unset) and lasts
  ``--cooldown-steps`` (a list: one member per length; unset: the parent's).
  ``--schedule wsd`` on a parent of another schedule is refused (its state
  has no ``decay_start`` / ``cooldown_steps`` to set).

  Raises:
    ConfigError: a model, data or optimizer option, or ``--seeds``, set to
      another value than the parent's; ``--steps`` not beyond the branch
      point, or (``--schedule wsd``) short of the longest cooldown's end;
      each naming the option, the parent's value and the given one.
  """
  default, theirs = SweepConfig(), parent.config
  model = _merge('model', config.model, default.model, theirs.model)
  expect(model.with_sizes() == theirs.model.with_sizes(), 'model',
         f'{theirs.model.with_sizes()}, the parent run\'s model', model.with_sizes(),
         ConfigError)
  data = _merge('data', config.data, default.data, theirs.data)
  changes = {}
  for name in hparams_lib.SETTINGS:
    if name in hparams_lib.ROLLBACK_DEFAULTS:
      continue         # a single run's rollback: a population has none (refuse_rollback)
    value, parents = getattr(config.optimizer, name), getattr(theirs.optimizer, name)
    if value == getattr(default.optimizer, name):
      changes[name] = parents
    else:
      expect(value == parents, config_lib._flag('optimizer', name), f'{parents!r}, the parent '
             'run\'s value (a fork continues its optimizer; leave the option out to take it)',
             repr(value), ConfigError)
  for row in hparams_lib.HPARAMS:
    if (getattr(config.optimizer, row.field) == getattr(default.optimizer, row.field)
        and hasattr(theirs.optimizer, row.field)):
      changes[row.field] = repr(float(getattr(theirs.optimizer, row.field)))
  if changes.get('schedule', config.optimizer.schedule) == 'wsd':
    # The parent's schedule values as its run resolved them; the cooldown starts at the
    # branch point unless --decay-start says otherwise.
    resolved = hparams_lib.schedule_values(theirs.optimizer.values(),
                                           theirs.run.decay_steps or theirs.run.steps)
    if config.optimizer.decay_start == default.optimizer.decay_start:
      changes['decay_start'] = repr(float(parent.step))
    if config.optimizer.cooldown_steps == default.optimizer.cooldown_steps:
      changes['cooldown_steps'] = repr(resolved['cooldown_steps'])
  optimizer = dataclasses.replace(config.optimizer, **changes)
  # A sweep's cosine spans its --steps; the parent's may span --decay-steps (a
  # budget's planned schedule): the fork continues it only when they agree.
  decay = theirs.run.decay_steps
  expect(decay is None or optimizer.schedule == 'wsd' or config.run.steps == decay, 'steps',
         f"{decay}, the parent run's --decay-steps (a fork continues its schedule, and a "
         "sweep's spans its --steps; or branch a cooldown: --schedule wsd)",
         config.run.steps, ConfigError)
  seed = theirs.run.seed
  seeds = parse_seeds(config.population.seeds)
  expect(config.population.seeds == default.population.seeds or seeds == (seed,), 'seeds',
         f"'{seed}', the parent run's seed (a fork reads the parent's batches on)",
         repr(config.population.seeds), ConfigError)
  expect(config.run.steps > parent.step, 'steps', f'> {parent.step}, the branch point '
         f'(the step of {parent.workdir}\'s checkpoint)', config.run.steps, ConfigError)
  population = dataclasses.replace(config.population, seeds=str(seed))
  forked = dataclasses.replace(config, model=model, data=data, optimizer=optimizer,
                               population=population)
  if optimizer.schedule == 'wsd':      # --steps reaches the longest cooldown's end
    specs = forked.specs()
    start, length = (_highest(specs[name]) for name in ('decay_start', 'cooldown_steps'))
    end = math.ceil(start + length)
    expect(config.run.steps >= end, 'steps', f'at least {end} (--decay-start {_number(start)} '
           f"+ --cooldown-steps {_number(length)}; the members' cooldowns end there)",
           config.run.steps, ConfigError)
  return forked


def _highest(spec) -> float:
  """The largest value of a sweep spec (a tuple, or a distribution's ``high``)."""
  return max(spec) if isinstance(spec, tuple) else spec.high


def _number(value: float) -> str:
  return str(int(value)) if float(value).is_integer() else f'{value:g}'


def population(parent: Parent, job, hparams: dict):
  """The parent's state at its step, restored and forked into the members
  (:func:`purax.fork`), on the default device.

  Raises:
    ConfigError: the restored state's structure differs from the sweep's
      (its model or optimizer), naming both.
    CheckpointError: the checkpoint cannot be restored.
  """
  state = parent.state
  if state is None:
    parent_job = job_lib.build(parent.config, mesh=False)
    with Checkpointer(os.path.join(parent.workdir, 'checkpoints'), read_only=True) as ckpt:
      state = ckpt.restore(parent_job.abstract, parent.step)[0]['state']
  want = jax.eval_shape(job.task.init, jax.random.key(0), job.sample)
  shapes = lambda t: jax.tree.map(lambda x: (x.shape, str(x.dtype)), t)   # noqa: E731
  expect(jax.tree.structure(state) == jax.tree.structure(want)
         and shapes(state) == shapes(want), '--from',
         "a run whose state has the sweep's structure (its model and optimizer)",
         f'{parent.workdir} step {parent.step}, whose state differs', ConfigError)
  return fork(state, hparams)


def lineage(parent: Parent) -> dict:
  """What a forked sweep records of its parent: ``{'parent': workdir, 'step':
  the branch point, 'checkpoint_sha256': the checkpoint's identity,
  'parent_config': the parent's config (flat names)}``."""
  return {'parent': parent.workdir, 'step': parent.step, 'checkpoint_sha256': parent.sha256,
          'parent_config': parent.config.flat()}
