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

The check reads the spike count from the log point's window when it is one
(the CLI checks at a divisor of ``--log-every``, so usually), else it waits
for the queued steps (one host sync). The snapshots: at every check without
a rollback the state is copied on the device (one dispatch) and that copy is
read to the host in a thread (the training goes on meanwhile); on the CPU,
where the arrays are in host memory, the step has finished (the window's
host read came first) and they are copied at once (a memcpy, before the
next step donates them) into the arrays of the snapshot the ring drops once
it is full, with no device op (a typed key's data is read where jax keeps
it). The ring keeps ``steps // every`` of them
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
import functools
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


def _key_data(x):
  """A typed key's uint32 data: the array jax keeps it in (``_base_array``:
  no device op, whose dispatch after the train steps is dearer than the
  snapshot's copy on the CPU), else ``jax.random.key_data``."""
  data = getattr(x, '_base_array', None)
  return jax.random.key_data(x) if data is None else data


@functools.lru_cache(maxsize=None)
def _key_data_spec(shape: tuple, dtype) -> jax.ShapeDtypeStruct:
  """The shape and dtype of the data of typed keys of ``shape`` and key ``dtype`` (traced once)."""
  return jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(shape, dtype))


@jax.jit
def _copy(leaves):
  """A device copy of the state's leaves (typed keys as their data): not donated, read later."""
  return [jax.random.key_data(x) if _is_key(x) else jnp.copy(x) for x in leaves]


def _in_host_memory(leaves) -> bool:
  """Whether every array of ``leaves`` is in host memory (on CPU devices)."""
  return all(d.platform == 'cpu' for x in leaves for d in getattr(x, 'devices', lambda: ())())


def _names(window):
  """The names of the metrics window's tree (its values not read: no device op)."""
  if isinstance(window, metrics_lib.Window):
    return jax.tree.unflatten(window.treedef, window.leaves)
  return window


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
    self.ring: list[tuple[int, Any]] = []   # (step, host leaves or a Future), oldest first
    self._pool = None        # the thread that reads device copies (made at the first)
    self._keys = None        # per leaf of the state: a typed key (read at a fit's first snapshot)
    self._on_host = None     # the state's arrays are in host memory (the CPU)

  # -- the ring --

  def _snapshot(self, step: int, state) -> None:
    if any(s == step for s, _ in self.ring):
      return
    leaves = jax.tree.leaves(state)
    if self._keys is None:     # once per fit: which leaves are typed keys, where they live
      self._keys = [_is_key(x) for x in leaves]
      self._on_host = _in_host_memory(leaves)
    if self._on_host:          # the CPU: the arrays are in host memory, copied now (memcpy)
      leaves = [_key_data(x) if key else x for x, key in zip(leaves, self._keys)]
      if len(self.ring) == self.slots:     # into the oldest snapshot's arrays, dropped below
        snapshot = self.ring[0][1]
        for out, x in zip(snapshot, leaves, strict=True):
          np.copyto(out, np.asarray(x))
      else:
        snapshot = [np.array(x) for x in leaves]
    else:                      # a device copy (dispatched), read to the host in a thread
      if self._pool is None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
      snapshot = self._pool.submit(jax.device_get, _copy(leaves))
    self.ring.append((step, snapshot))
    del self.ring[:-self.slots]

  def _host(self, i: int) -> list:
    """The leaves of the ring's snapshot ``i`` on the host (numpy; typed keys as their data)."""
    step, leaves = self.ring[i]
    if isinstance(leaves, concurrent.futures.Future):
      leaves = leaves.result()
      self.ring[i] = (step, leaves)
    return leaves

  def init_arrays(self, state) -> dict:
    """The ring's array state in a checkpoint: ``steps`` int32 ``[slots]``
    (-1: empty) and ``states``, the state's leaves stacked ``[slots, ...]``
    (typed keys as their uint32 data); numpy zeros (host memory, not touched
    until written)."""
    def zeros(x):
      data = _key_data_spec(tuple(x.shape), x.dtype) if _is_key(x) else x
      return np.zeros((self.slots,) + tuple(data.shape), data.dtype)
    return {'steps': np.full((self.slots,), -1, np.int32),
            'states': jax.tree.map(zeros, state)}

  @property
  def arrays(self) -> dict:
    snapshots = [self._host(i) for i in range(len(self.ring))]
    steps = np.full((self.slots,), -1, np.int32)
    steps[:len(snapshots)] = [s for s, _ in self.ring]
    specs, treedef = jax.tree.flatten(self._empty)
    states = []
    for j, spec in enumerate(specs):
      out = np.zeros(spec.shape, spec.dtype)
      for i, leaves in enumerate(snapshots):
        out[i] = leaves[j]
      states.append(out)
    return {'steps': steps, 'states': jax.tree.unflatten(treedef, states)}

  @arrays.setter
  def arrays(self, value) -> None:
    value = jax.device_get(value)
    self._empty = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
                               value['states'])
    leaves = jax.tree.leaves(value['states'])
    self.ring = [(s, [np.array(x[i]) for x in leaves])
                 for i, s in enumerate(int(s) for s in value['steps']) if s >= 0]
    self._keys = self._on_host = None     # read again from this fit's state
    self._begun = False

  def _restore(self, i: int, template, plan):
    current, treedef = jax.tree.flatten(template)
    # Copies: a CPU device_put may keep a numpy array's memory, and the ring's
    # arrays are written again by later snapshots.
    state = jax.tree.unflatten(treedef, [
        jax.random.wrap_key_data(np.array(x), impl=jax.random.key_impl(cur)) if _is_key(cur)
        else np.array(x) for cur, x in zip(current, self._host(i), strict=True)])
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
    expect('spikes' in _names(run.window), 'spike_rollback',
           'a task with a spike guard (purax.Task(spike_guard=purax.SpikeGuard(...)))',
           'no spikes metric', ConfigError)
    if self.action == 'lower-lr':
      self._rate_name(info.state)
    if not hasattr(self, '_empty'):
      self._empty = jax.eval_shape(self.init_arrays, info.state)['states']
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
