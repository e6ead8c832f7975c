"""The optimizer table of the command line: ``--optimizer NAME``.

:data:`OPTIMIZERS` maps a name to a row: the builder (an optimizer of
:mod:`purax.core.optim` / :mod:`purax.core.optimizers`, every hyperparameter
injected; named by import path, imported on use, so ``--help`` needs no
optax), the hyperparameters it takes (state names of the rows of
:data:`purax.app.hparam_table.HPARAMS`: the ``--FLAG`` s that apply, and what
``purax sweep`` / PBT may vary), its schedule (for ``purax plot``) and its
evaluation params (``purax.Task(eval_params=...)``). A hyperparameter row an
optimizer does not take is refused by name when set.

:data:`WEIGHT_DECAY_MASKS` names the ``--weight-decay-mask`` choices:
``matrices`` (the default: decay the leaves of ``ndim >= 2`` only,
:func:`purax.core.optim.matrices`) and ``all`` (every leaf: how purax
trained before 0.2; a run saved before the option existed resumes with it).

Adding an optimizer to the CLI is one row here (and, for a hyperparameter of
its own, one row of ``HPARAMS`` and of :data:`purax.core.hparams.BOUNDS`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from purax.core import lazy


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  """A row of the table.

  Attributes:
    builder: ``(*, learning_rate, total_steps, warmup_steps, weight_decay_mask,
      **hyperparams) -> optax transformation`` (keyword names: the
      builder's; ``learning_rate`` is the peak), or its import path
      (``'purax.core.optim:adamw'``, imported on use).
    hparams: the state names of the hyperparameters it takes (each a row of
      ``HPARAMS``, the builder's keyword names).
    help: one line for ``--help``.
    schedule: its learning-rate schedule, a key of :data:`purax.core.optim.SCHEDULES`.
    evaluated: ``state -> params`` to evaluate (``purax.Task(eval_params=)``),
      its import path, or None.
    leaf_table: ``params -> str``, which leaf gets which part of the
      optimizer (``--dry-run`` prints it), its import path, or None.
    schedules: the other schedules its builder takes (``--schedule NAME``
      -> ``schedule=NAME`` and the schedule's hyperparameters,
      :data:`purax.core.optim.SCHEDULE_HPARAMS`).
  """

  builder: Callable[..., optax.GradientTransformation] | str
  hparams: tuple[str, ...]
  help: str
  schedule: str = 'cosine'
  evaluated: Callable | str | None = None
  leaf_table: Callable | str | None = None
  schedules: tuple[str, ...] = ()

  @property
  def build(self) -> Callable[..., optax.GradientTransformation]:
    """The builder (imported on first use when the row names it by path)."""
    return lazy.resolve(self.builder)

  @property
  def eval_params(self) -> Callable | None:
    """``state -> params`` to evaluate, or None."""
    return lazy.resolve(self.evaluated)

  def transformation(self, values: Mapping[str, float], *, total_steps: int,
                     warmup_steps: int, weight_decay_mask,
                     schedule: str = 'default') -> optax.GradientTransformation:
    """The transformation of hyperparameter ``values`` (state names; those it
    does not take are ignored); ``schedule``: ``'default'`` (the row's own) or
    one of its ``schedules``, whose hyperparameters ``values`` gives."""
    kwargs = {name: float(values[name]) for name in self.hparams}
    if schedule != 'default':
      kwargs['schedule'] = schedule
      kwargs.update({name: float(values[name]) for name in SCHEDULE_ROWS[schedule]})
    return self.build(total_steps=total_steps, warmup_steps=warmup_steps,
                      weight_decay_mask=weight_decay_mask, **kwargs)


#: The optimizer table: ``--optimizer`` name -> :class:`OptimizerSpec` (builder,
#: hyperparameters it injects, help).
OPTIMIZERS: dict[str, OptimizerSpec] = {
    'adamw': OptimizerSpec(
        'purax.core.optim:adamw', ('learning_rate', 'weight_decay', 'b1', 'b2', 'clip_norm'),
        'AdamW, warmup then cosine decay to 0 (purax.adamw; --schedule wsd: warmup, '
        'constant, 1-sqrt cooldown)', schedules=('wsd',)),
    'sgd': OptimizerSpec(
        'purax.core.optimizers:sgd', ('learning_rate', 'momentum', 'weight_decay',
                                      'clip_norm'),
        'SGD with momentum and L2 weight decay, warmup then cosine'),
    'muon': OptimizerSpec(
        'purax.core.optimizers:muon', ('learning_rate', 'momentum', 'weight_decay', 'b1',
                                       'b2', 'clip_norm'),
        'Muon on the hidden matrices (attention, MLP, convolution kernels), AdamW on '
        'embeddings, head, norms, biases (--dry-run prints which), warmup then cosine',
        leaf_table='purax.core.muon:leaf_table'),
    'schedule_free_adamw': OptimizerSpec(
        'purax.core.optimizers:schedule_free_adamw', ('learning_rate', 'weight_decay',
                                                      'b1', 'b2', 'clip_norm'),
        'schedule-free AdamW, warmup then constant; evaluated at its average x',
        schedule='constant', evaluated='purax.core.optimizers:schedule_free_eval_params'),
}

#: ``--schedule`` choices besides ``default`` (each optimizer's own) -> the
#: hyperparameter rows of that schedule (its injected hyperparameters,
#: :data:`purax.core.optim.SCHEDULE_HPARAMS`, which a test keeps equal).
SCHEDULE_ROWS: dict[str, tuple[str, ...]] = {'wsd': ('decay_start', 'cooldown_steps')}

#: ``--weight-decay-mask`` choices: name -> the builders' ``weight_decay_mask``
#: (a function of the params, by import path; None: every leaf). :func:`weight_decay_mask`
#: gives the function.
WEIGHT_DECAY_MASKS: dict[str, str | None] = {'matrices': 'purax.core.optim:matrices',
                                             'all': None}


def weight_decay_mask(name: str) -> Callable | None:
  """The builders' ``weight_decay_mask`` of ``--weight-decay-mask name``."""
  return lazy.resolve(WEIGHT_DECAY_MASKS[name])
