"""The optimizer table of the command line: ``--optimizer NAME``.

:data:`OPTIMIZERS` maps a name to a row: the builder (an optimizer of
:mod:`purax.core.optim` / :mod:`purax.core.optimizers`, every hyperparameter
injected), the hyperparameters it takes (state names of the rows of
:data:`purax.app.hparams.HPARAMS`: the ``--FLAG`` s that apply, and what
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

import optax

from purax.core import optim, optimizers


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  """A row of the table.

  Attributes:
    build: ``(*, learning_rate, total_steps, warmup_steps, weight_decay_mask,
      **hyperparams) -> optax transformation`` (keyword names: the
      builder's; ``learning_rate`` is the peak).
    hparams: the state names of the hyperparameters it takes (each a row of
      ``HPARAMS``; ``peak_learning_rate`` is passed as ``learning_rate``).
    help: one line for ``--help``.
    schedule: its learning-rate schedule, a key of :data:`purax.core.optim.SCHEDULES`.
    eval_params: ``state -> params`` to evaluate (``purax.Task(eval_params=)``), or None.
  """

  build: Callable[..., optax.GradientTransformation]
  hparams: tuple[str, ...]
  help: str
  schedule: str = 'cosine'
  eval_params: Callable | None = None

  def transformation(self, values: Mapping[str, float], *, total_steps: int,
                     warmup_steps: int, weight_decay_mask) -> optax.GradientTransformation:
    """The transformation of hyperparameter ``values`` (state names; those it
    does not take are ignored)."""
    kwargs = {('learning_rate' if name == 'peak_learning_rate' else name): float(values[name])
              for name in self.hparams}
    return self.build(total_steps=total_steps, warmup_steps=warmup_steps,
                      weight_decay_mask=weight_decay_mask, **kwargs)


#: The optimizer table: ``--optimizer`` name -> :class:`OptimizerSpec` (builder,
#: hyperparameters it injects, help).
OPTIMIZERS: dict[str, OptimizerSpec] = {
    'adamw': OptimizerSpec(
        optim.adamw, ('peak_learning_rate', 'weight_decay', 'b1', 'b2', 'clip_norm'),
        'AdamW, warmup then cosine decay to 0 (purax.adamw)'),
    'sgd': OptimizerSpec(
        optimizers.sgd, ('peak_learning_rate', 'momentum', 'weight_decay', 'clip_norm'),
        'SGD with momentum and L2 weight decay, warmup then cosine'),
    'muon': OptimizerSpec(
        optimizers.muon, ('peak_learning_rate', 'momentum', 'weight_decay', 'b1', 'b2',
                          'clip_norm'),
        "Muon on the 2-D leaves (optax.contrib.muon), AdamW on the others, warmup then cosine"),
    'schedule_free_adamw': OptimizerSpec(
        optimizers.schedule_free_adamw, ('peak_learning_rate', 'weight_decay', 'b1', 'b2',
                                         'clip_norm'),
        'schedule-free AdamW, warmup then constant; evaluated at its average x',
        schedule='constant', eval_params=optimizers.schedule_free_eval_params),
}

#: ``--weight-decay-mask`` choices: name -> the builders' ``weight_decay_mask``.
WEIGHT_DECAY_MASKS: dict[str, Callable | None] = {'matrices': optim.matrices, 'all': None}
