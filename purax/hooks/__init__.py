"""Hooks: everything :func:`purax.fit` does besides stepping, on one protocol
(the CLU periodic-action idea; levanter's ``TrainerHooks``).

A hook is any object with

- ``every``: when it runs, after the call that took ``state.step`` from
  ``first`` to ``step`` (:func:`due`): ``n >= 1``, at multiples of ``n`` (calls
  end at them: with an integer ``steps_per_call = k`` every ``n`` must be a
  multiple of ``k``, a :class:`purax.ConfigError` otherwise; ``'auto'``
  picks a ``k`` that divides every ``n``); ``0``: after every evaluation;
  ``None``: after every call, and once before the first (``info.first ==
  info.step``);
- ``__call__(info: StepInfo) -> Output | None``: ``info`` is the read-only
  step record (:class:`StepInfo`: the step range, the state, the numbers
  written at this step so far, the run's :class:`End` once it has ended);
  the hook returns None or an :class:`Output` (a new state, numbers to
  write, ``stop=End(...)`` to end the run after this step, histograms);

and optionally

- ``state_dict() -> JSON`` and ``load_state_dict(d)``: what a later decision
  depends on (best score, patience counter), saved in every checkpoint and
  restored on resume.

That is the whole protocol: three methods. Attributes a hook may set:
``order`` (hooks run in increasing ``order``, default 0; the built-ins:
:class:`NonFiniteReplay` -16, :class:`NonFiniteStreak` -15, :class:`Evaluate`
-10, :class:`EarlyStopping` 5, :class:`Log` 15, :class:`Stop` 17,
:class:`Checkpoint` 20, :class:`Progress` 30, :class:`Profile` 100; so a user
hook sees this step's evaluation, its numbers are logged and its state is in
this step's checkpoint); ``name`` (its key in the checkpoint, default the
class name); ``option`` (what an error about its ``every`` calls it);
``alone`` (a ``range`` of ``state.step`` whose updates run one per call);
``keep_batches`` (batches of an iterable source to keep for
:meth:`StepInfo.batch`); ``log_every`` (:class:`Log`: the log points);
``init_arrays(state)`` with an ``arrays`` attribute (array state too large for
JSON, saved in the checkpoint's array tree, :class:`EMA`); ``rewound(step)``
(called when a hook sent the run back to a past step, :class:`SpikeRollback`:
:class:`Checkpoint` deletes the checkpoints after it).

The end of a run, in one place (``purax.hooks.runner._Loop.finish``): once
the run has ended, every hook is called once more at the last step with
``info.end`` set and ``info.forced`` where its cadence did not call it there
(levanter's ``run_hooks(info, force=True)``); a hook's final call does what
its end needs (:class:`Checkpoint` saves unless the run failed,
:class:`Evaluate` evaluates a finished run not evaluated at its last step,
:class:`Log` writes the end) or nothing.

Hooks written for the protocol before 0.3 (``__call__(step, state, record)
-> (state, info)``, ``at_end``, ``start(loop)``, ``end(loop)``) still run,
with a ``DeprecationWarning``, until 0.4.

Provided: the loop's own (:class:`Log`, :class:`Evaluate`,
:class:`NonFiniteReplay`, :class:`NonFiniteStreak`, :class:`Stop`, :class:`Checkpoint`,
:class:`Progress`, :class:`Profile`; :func:`standard` builds them) and the
library (:class:`EarlyStopping`, :class:`PopulationEarlyStopping`,
:class:`PBT`, :class:`EMA`, :class:`Histograms`, :class:`TimeBudget`,
:class:`SpikeRollback`).

Your own hook is a plain class. This one writes the global parameter norm
every 10 steps and ends the run when the training loss falls below a
target; its one number of state (the step it first got there) survives a
resume.

Example:
  >>> class StopAtLoss:
  ...   every = 10            # run at steps 10, 20, ... (0: after every evaluation)
  ...   name = 'stop_at_loss' # its key in the checkpoint's hook state
  ...
  ...   def __init__(self, target):
  ...     self.target, self.reached = target, None
  ...
  ...   def __call__(self, info):
  ...     if info.end is not None:             # the run's final call: nothing to do
  ...       return None
  ...     numbers = {'params/global_norm': float(optax.global_norm(info.state.params))}
  ...     loss = info.metrics.get('train/loss')   # written at this step when it is a log point
  ...     stop = None
  ...     if loss is not None and loss < self.target:
  ...       self.reached = info.step if self.reached is None else self.reached
  ...       stop = purax.hooks.End('early_stopped', info.step, f'train/loss below {self.target}')
  ...     return purax.hooks.Output(metrics=numbers, stop=stop)
  ...
  ...   def state_dict(self):
  ...     return {'reached': self.reached}
  ...
  ...   def load_state_dict(self, d):
  ...     self.reached = d['reached']
  >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
  ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
  >>> hooks = purax.hooks.standard(log_every=10) + [StopAtLoss(target=10.0)]
  >>> state = task.init(jax.random.key(0), batch)
  >>> state, history = purax.fit(task, state, batches, steps=20, hooks=hooks)
  >>> int(state.step), history.end.status    # ended at its first log point
  (10, 'early_stopped')
  >>> 'params/global_norm' in history[-1]
  True
"""

from purax.hooks.time_budget import TimeBudget as TimeBudget
from purax.hooks.builtin import Checkpoint as Checkpoint
from purax.hooks.builtin import Evaluate as Evaluate
from purax.hooks.builtin import Log as Log
from purax.hooks.builtin import NonFiniteStreak as NonFiniteStreak
from purax.hooks.builtin import Profile as Profile
from purax.hooks.builtin import Progress as Progress
from purax.hooks.builtin import Stop as Stop
from purax.hooks.library import EMA as EMA
from purax.hooks.library import PBT as PBT
from purax.hooks.library import EarlyStopping as EarlyStopping
from purax.hooks.library import Histograms as Histograms
from purax.hooks.library import PopulationEarlyStopping as PopulationEarlyStopping
from purax.hooks.library import scores as scores
from purax.hooks.nonfinite import NonFiniteReplay as NonFiniteReplay
from purax.hooks.record import STATUSES as STATUSES
from purax.hooks.rollback import SpikeRollback as SpikeRollback
from purax.hooks.record import End as End
from purax.hooks.record import Output as Output
from purax.hooks.record import StepInfo as StepInfo
from purax.hooks.runner import due as due
from purax.hooks.runner import next_due as next_due
from purax.hooks.standard import standard as standard


from purax.core import lazy as _lazy  # noqa: E402

# Public until 0.3; what hooks saw of the loop, now private (they get a StepInfo).
__getattr__, _ = _lazy.attach(__name__, {}, deprecated={
    'Loop': ('purax.hooks.runner:_Loop', 'purax.hooks.StepInfo (hooks get the step record, '
             'not the loop)', '0.4'),
})
# Renamed in 0.3 (no two modules of one file name): the old import path still works.
_lazy.moved('purax.hooks.loop', 'purax.hooks.runner')

__all__ = [
    'Checkpoint',
    'EMA',
    'EarlyStopping',
    'End',
    'Evaluate',
    'Histograms',
    'Log',
    'NonFiniteReplay',
    'NonFiniteStreak',
    'Output',
    'PBT',
    'PopulationEarlyStopping',
    'Profile',
    'Progress',
    'STATUSES',
    'SpikeRollback',
    'StepInfo',
    'Stop',
    'TimeBudget',
    'due',
    'next_due',
    'scores',
    'standard',
]
