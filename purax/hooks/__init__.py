"""Hooks: everything :func:`purax.fit` does besides stepping, on one protocol
(the CLU periodic-action idea; levanter's ``TrainerHooks``).

A hook is any object with

- ``every``: when it runs, after the call that took ``state.step`` from
  ``first`` to ``step`` (:func:`due`): ``n >= 1``, at multiples of ``n`` (calls
  end at them: with an integer ``steps_per_call = k`` every ``n`` must be a
  multiple of ``k``, a :class:`purax.ConfigError` otherwise; ``'auto'``
  picks a ``k`` that divides every ``n``); ``0``: after every evaluation;
  ``None``: after every call;
- ``at_end``: also run at the last step, whatever the cadence;
- ``__call__(step, state, record) -> (state, info)``: ``step`` is the true
  ``state.step`` after the update; ``record`` holds the numbers written at
  this step so far (``train/*``, ``eval/*``, each a float or, for a
  population, a ``[members]`` array); the hook returns the state (changed or
  not) and a dict of numbers to write (``{'stop': True}`` ends training after
  this step, checkpointed; ``'histograms': {tag: array}`` goes to the
  writers' ``write_histograms``);

and optionally

- ``order``: hooks run in increasing ``order`` (default 0; the loop's own:
  :class:`Log` -20, :class:`NonFiniteReplay` -16, :class:`NonFiniteStreak` -15,
  :class:`Evaluate` -10, :class:`EarlyStopping` 5, :class:`Stop` 10,
  :class:`Checkpoint` 20, :class:`Progress` 30, :class:`Profile` 100), so a
  user hook sees this step's logs and evaluation and its state is in this
  step's checkpoint;
- ``name``: its key in the checkpoint (default: the class name); ``option``:
  what an error about its ``every`` calls it (default ``NAME.every``);
- ``state_dict() -> JSON`` and ``load_state_dict(d)``: what a later decision
  depends on (best score, patience counter), saved in every checkpoint and
  restored on resume;
- ``init_arrays(state) -> pytree`` and an ``arrays`` attribute: array state
  too large for JSON (an average of the params), saved in the checkpoint's
  array tree (``hooks/<name>``); ``init_arrays`` must be traceable;
- ``alone``: a ``range`` of ``state.step`` whose updates must run one per call
  (:class:`Profile`);
- ``start(loop)`` and ``end(loop)``: at the start of ``fit`` and once at its
  end, however it ends (:class:`Loop`).

Provided: the loop's own (:class:`Log`, :class:`Evaluate`,
:class:`NonFiniteReplay`, :class:`NonFiniteStreak`, :class:`Stop`, :class:`Checkpoint`,
:class:`Progress`, :class:`Profile`; :func:`standard` builds them) and the
library (:class:`EarlyStopping`, :class:`PopulationEarlyStopping`,
:class:`PBT`, :class:`EMA`, :class:`Histograms`).

Your own hook is a plain class. This one writes the global parameter norm
every 10 steps and stops the run when the training loss falls below a
target; its one number of state (the step it first got there) survives a
resume.

Example:
  >>> class StopAtLoss:
  ...   every = 10            # run at steps 10, 20, ... (0: after every evaluation)
  ...   at_end = False        # not at the last step unless it falls on the cadence
  ...   name = 'stop_at_loss' # its key in the checkpoint's hook state
  ...
  ...   def __init__(self, target):
  ...     self.target, self.reached = target, None
  ...
  ...   def __call__(self, step, state, record):
  ...     info = {'params/global_norm': float(optax.global_norm(state.params))}
  ...     loss = record.get('train/loss')      # written at this step when it is a log point
  ...     if loss is not None and loss < self.target:
  ...       self.reached = step if self.reached is None else self.reached
  ...       info['stop'] = True
  ...     return state, info
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
  >>> int(state.step)                     # stopped at its first log point
  10
  >>> 'params/global_norm' in history[-1]
  True
"""

from purax.hooks.builtin import Checkpoint as Checkpoint
from purax.hooks.builtin import Evaluate as Evaluate
from purax.hooks.builtin import Log as Log
from purax.hooks.builtin import NonFiniteStreak as NonFiniteStreak
from purax.hooks.builtin import Profile as Profile
from purax.hooks.builtin import Progress as Progress
from purax.hooks.builtin import Stop as Stop
from purax.hooks.builtin import standard as standard
from purax.hooks.library import EMA as EMA
from purax.hooks.library import PBT as PBT
from purax.hooks.library import EarlyStopping as EarlyStopping
from purax.hooks.library import Histograms as Histograms
from purax.hooks.library import PopulationEarlyStopping as PopulationEarlyStopping
from purax.hooks.library import scores as scores
from purax.hooks.loop import Loop as Loop
from purax.hooks.nonfinite import NonFiniteReplay as NonFiniteReplay
from purax.hooks.loop import due as due
from purax.hooks.loop import next_due as next_due
