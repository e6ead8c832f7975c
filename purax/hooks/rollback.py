"""Rolling a loss spike back: an option of the spike guard, on the host.

The step only reports spikes (:class:`purax.SpikeGuard` skips a spiking
update and counts it in ``metrics['spikes']``). :class:`SpikeRollback` reads
that count every ``every`` steps (one host read of the metrics window, the
training's other arrays untouched) and, when ``spikes`` or more of the last
``every`` steps were spikes, restores the state of ``steps`` steps back from
a ring of snapshots on the host, then

- ``action='skip-data'``: skips the data steps that led to the spike: the
  batch of ``state.step`` ``s`` is ``data[s + offset]`` from then on, the
  ``offset`` grown by the steps rolled back (saved in the checkpoint's data
  position, ``{'next_step', 'offset'}``, and restored by :func:`purax.fit`);
- ``action='lower-lr'``: replays the same data with the learning rate (the
  state's ``learning_rate``,
  :func:`purax.core.hparams.set`) scaled by ``lr_scale`` for ``lr_steps``
  steps, then set back.

The snapshots: at every check without a rollback the state is copied on the
device (one dispatch) and that copy is read to the host in a thread (the
training goes on meanwhile); on the CPU, where the arrays are in host memory,
they are copied at once (a memcpy, before the next step donates them). The
check reads the spike count from the log point's window when it is one (the
CLI checks at a divisor of ``--log-every``, so usually), else it waits for
the queued steps (one host sync). The ring keeps ``steps // every`` of them
(``steps // every`` host copies of the state) and is saved in every
checkpoint (the hook's array state), so a resumed run rolls back to the same
snapshot as the run it resumes. A check ``c`` rolls back to ``c - steps``
(or the oldest snapshot, early in a run) and only when ``c`` is past every
check it has already rolled back from: replayed steps that spike again are
skipped by the guard, not rolled back again (no rollback loop).

Every rollback is an event: numbers at the check's step in the record
(``rollback/from_step``, ``rollback/to_step``, ``rollback/spikes``, and
``rollback/skip_data_steps`` or ``rollback/lr_scale`` and
``rollback/lr_steps``), written to ``metrics.jsonl`` by :class:`purax.hooks.Log`,
and an entry of ``SpikeRollback.events``, saved in every checkpoint. The
rollback is a pure function of the metrics and the checkpointed state, so a
rerun of the same command, and a run killed and resumed, roll back at the
same steps to the same states and end bitwise equal (on the CPU).

Needs random-access training data (the batch of a step read again) and a
single :class:`purax.TrainState` (not a population, one process).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purax.core import hparams as hparams_lib
from purax.core import metrics as metrics_lib
from purax.core.errors import ConfigError, expect
from purax.core.state import TrainState
from purax.hooks.record import Output

#: The actions after a rollback (:class:`SpikeRollback`, ``--spike-action``).
ACTIONS = ('skip-data', 'lower-lr')


def _is_key(x) -> bool:
  return jax.dtypes.issubdtype(getattr(x, 'dtype', None), jax.dtypes.prng_key)


@jax.jit
def _copy(state):
  """A device copy of ``state`` (typed keys as their data): not donated, read later."""
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else jnp.copy(x), state)


def _int(value, name: str, low: int) -> int:
  expect(isinstance(value, (int, np.integer)) and not isinstance(value, bool)
         and value >= low, name, f'an integer >= {low}', repr(value), ConfigError)
  return int(value)


class SpikeRollback:
  """On a loss spike, restores the state of ``steps`` steps back and skips the
  data that led to it or lowers the learning rate (the module docstring).

  Attributes:
    steps: steps to roll back (a multiple of ``every``, >= 1).
    every: steps between checks and snapshots (default ``steps``); every
      :class:`purax.hooks.Log` cadence must be a multiple of it.
    spikes: spikes within one check's ``every`` steps that roll back (>= 1).
    action: ``'skip-data'`` or ``'lower-lr'``.
    lr_scale: the factor of the learning rate after a rollback (in (0, 1]) (``'lower-lr'``).
    lr_steps: steps with the lowered rate (a multiple of ``every``; default ``steps``).
    events: every rollback so far, ``{'step', 'spikes', 'to_step', 'action',
      'offset', ...}`` (JSON; in the checkpoint).

  Raises (at construction):
    ConfigError: an option out of range, naming it (``spike_rollback``,
      ``spike_rollback_every``, ``spike_rollback_spikes``, ``spike_action``,
      ``spike_lr_scale``, ``spike_lr_steps``).
  """

  order, name, option = 14, 'spike_rollback', 'spike_rollback_every'

  def __init__(self, steps: int, *, every: int | None = None, spikes: int = 1,
               action: str = 'skip-data', lr_scale: float = 0.1, lr_steps: int | None = None):
    self.steps = _int(steps, 'spike_rollback', 1)
    self.every = self.steps if every is None else _int(every, 'spike_rollback_every', 1)
    expect(self.steps % self.every == 0, 'spike_rollback', f'a multiple of '
           f'spike_rollback_every={self.every} (snapshots are taken every that many steps)',
           self.steps, ConfigError)
    self.spikes = _int(spikes, 'spike_rollback_spikes', 1)
    expect(action in ACTIONS, 'spike_action', ' or '.join(map(repr, ACTIONS)), repr(action),
           ConfigError)
    self.action = action
    expect(isinstance(lr_scale, (int, float, np.floating)) and not isinstance(lr_scale, bool)
           and 0 < lr_scale <= 1, 'spike_lr_scale', 'a number in (0, 1]', repr(lr_scale),
           ConfigError)
    self.lr_scale = float(lr_scale)
    self.lr_steps = self.steps if lr_steps is None else _int(lr_steps, 'spike_lr_steps', 1)
    expect(self.lr_steps % self.every == 0, 'spike_lr_steps',
           f'a multiple of spike_rollback_every={self.every}', self.lr_steps, ConfigError)
    self.slots = self.steps // self.every
    self.events: list[dict] = []
    self.seen = 0.0          # spikes of the current metrics window already counted
    self.high = -1           # the furthest check rolled back from
    self.lowered: dict | None = None   # {'name', 'value', 'until'} while the rate is lowered
    self.ring: list[tuple[int, Any]] = []   # (step, host tree or Future), oldest first
    self._pool = None        # the thread that reads device copies (made at the first)
    self._on_host = None     # the state's arrays are in host memory (the CPU)

  # -- the ring --

  def _snapshot(self, step: int, state) -> None:
    if any(s == step for s, _ in self.ring):
      return
    if self._on_host is None:
      self._on_host = all(d.platform == 'cpu' for x in jax.tree.leaves(state)
                          for d in getattr(x, 'devices', lambda: ())())
    if self._on_host:          # the CPU: the arrays are in host memory, copied now (memcpy)
      tree = jax.tree.map(lambda x: np.array(jax.random.key_data(x) if _is_key(x) else x),
                          state)
    else:                      # a device copy (dispatched), read to the host in a thread
      if self._pool is None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
      tree = self._pool.submit(jax.device_get, _copy(state))
    self.ring.append((step, tree))
    del self.ring[:-self.slots]

  def _host(self, i: int):
    step, tree = self.ring[i]
    if isinstance(tree, concurrent.futures.Future):
      tree = tree.result()
      self.ring[i] = (step, tree)
    return tree

  def init_arrays(self, state) -> dict:
    """The ring's array state in a checkpoint: ``steps`` int32 ``[slots]``
    (-1: empty) and ``states``, the state's leaves stacked ``[slots, ...]``
    (typed keys as their uint32 data)."""
    def zeros(x):
      data = jax.eval_shape(jax.random.key_data, x) if _is_key(x) else x
      return jnp.zeros((self.slots,) + tuple(data.shape), data.dtype)
    return {'steps': jnp.full((self.slots,), -1, jnp.int32),
            'states': jax.tree.map(zeros, state)}

  @property
  def arrays(self) -> dict:
    trees = [self._host(i) for i in range(len(self.ring))]
    steps = np.full((self.slots,), -1, np.int32)
    steps[:len(trees)] = [s for s, _ in self.ring]
    if not trees:
      return {'steps': steps, 'states': self._empty}
    def stack(empty, *leaves):
      out = np.zeros(empty.shape, empty.dtype)
      out[:len(leaves)] = np.stack(leaves)
      return out
    return {'steps': steps, 'states': jax.tree.map(stack, self._empty, *trees)}

  @arrays.setter
  def arrays(self, value) -> None:
    value = jax.device_get(value)
    self._empty = jax.tree.map(np.zeros_like, value['states'])
    steps = [int(s) for s in value['steps']]
    self.ring = [(s, jax.tree.map(lambda x, i=i: np.array(x[i]), value['states']))
                 for i, s in enumerate(steps) if s >= 0]

  def _restore(self, i: int, template, plan):
    tree = self._host(i)
    state = jax.tree.map(lambda cur, x: jax.random.wrap_key_data(
        x, impl=jax.random.key_impl(cur)) if _is_key(cur) else x, template, tree)
    return plan.place(state)

  # -- JSON state --

  def state_dict(self) -> dict:
    return {'events': list(self.events), 'seen': self.seen, 'high': self.high,
            'lowered': self.lowered}

  def load_state_dict(self, d: dict) -> None:
    self.events = list(d.get('events', ()))
    self.seen, self.high = float(d.get('seen', 0.0)), int(d.get('high', -1))
    self.lowered = d.get('lowered')

  # -- the check --

  def _rate_name(self, state) -> str:
    known = hparams_lib.names(state)
    name = 'learning_rate' if 'learning_rate' in known else None
    expect(name is not None, 'spike_action', "'skip-data' (this optimizer carries no "
           "learning rate in its state to lower: optax.inject_hyperparams or purax.adamw)",
           "'lower-lr'", ConfigError)
    return name

  def _begin(self, info) -> None:
    run = info._run
    expect(isinstance(info.state, TrainState) and jax.process_count() == 1, 'spike_rollback',
           'a single TrainState on one process (not a population)',
           type(info.state).__name__, ConfigError)
    expect(run.source is not None and hasattr(run.source.data, '__getitem__')
           and hasattr(run.source.data, '__len__'), 'spike_rollback',
           'random-access train_data (a rollback reads past batches again)',
           type(getattr(run.source, 'data', None)).__name__, ConfigError)
    bad = [n for n in getattr(run, '_log_every', ()) if n % self.every]
    expect(not bad, 'spike_rollback_every', f'a divisor of log_every={bad[:1]} (a log point '
           'starts a new metrics window, whose spikes it counts)', self.every, ConfigError)
    expect('spikes' in metrics_lib.as_tree(run.window), 'spike_rollback',
           'a task with a spike guard (purax.Task(spike_guard=purax.SpikeGuard(...)))',
           'no spikes metric', ConfigError)
    if self.action == 'lower-lr':
      self._rate_name(info.state)
    if not hasattr(self, '_empty'):
      self._empty = jax.tree.map(np.asarray, jax.device_get(self.init_arrays(info.state)['states']))
    self._begun = True

  def __call__(self, info):
    if info.end is not None or info.first == info.step:
      return None
    if not getattr(self, '_begun', False):     # the checks, at the first call of a fit
      self._begin(info)
    step = info.step
    if info.window is not None:         # a log point read (and began anew) the window
      total = float(metrics_lib.as_tree(info.window)['spikes'].value)
      new, self.seen = total - self.seen, 0.0
    else:
      window = jax.device_get(info._run.window)     # one transfer; unpacked on the host
      total = float(metrics_lib.as_tree(window)['spikes'].value)
      new, self.seen = total - self.seen, total
    if step % self.every:
      return None
    if new >= self.spikes and step > self.high and self.ring:
      return self._rollback(info, int(new))
    out = None
    if self.lowered is not None and step >= self.lowered['until']:
      state = hparams_lib.set(info.state, {self.lowered['name']: self.lowered['value']})
      self.lowered = None
      out = Output(state=state)
    self._snapshot(step, info.state if out is None else out.state)
    return out

  def _rollback(self, info, spikes: int):
    step, run = info.step, info._run
    target = step - self.steps
    at = max((i for i, (s, _) in enumerate(self.ring) if s <= target), default=0)
    back = self.ring[at][0]
    state = self._restore(at, info.state, info.plan)
    del self.ring[at + 1:]                       # the abandoned steps' snapshots
    event = {'step': step, 'spikes': spikes, 'to_step': back, 'action': self.action}
    numbers = {'rollback/from_step': step, 'rollback/to_step': back,
               'rollback/spikes': spikes}
    offset = run.offset
    if self.action == 'skip-data':
      offset += step - back
      numbers['rollback/skip_data_steps'] = step - back
    else:
      name = self._rate_name(state)
      value = (self.lowered['value'] if self.lowered is not None
               else float(hparams_lib.get(jax.device_get(state))[name]))
      state = hparams_lib.set(state, {name: np.float32(value * self.lr_scale)})
      self.lowered = {'name': name, 'value': value, 'until': back + self.lr_steps}
      numbers.update({'rollback/lr_scale': self.lr_scale, 'rollback/lr_steps': self.lr_steps})
      event.update(lr_scale=self.lr_scale, lr_steps=self.lr_steps)
    event['offset'] = offset
    self.events.append(event)
    self.high = step
    run.rewind(state, back, offset)
    return Output(metrics=numbers)
