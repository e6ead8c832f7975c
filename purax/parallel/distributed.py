"""Multi-host runs on ``jax.distributed``, and global batches from per-process data.

Every process runs the same program. :func:`initialize` connects them
(``jax.distributed.initialize``; CPU collectives over gloo) before any device is
touched; afterwards ``jax.devices()`` lists the devices of all processes, so
:func:`purax.parallel.make_mesh` spans them all. Each process then reads only
its rows of every global batch (:func:`process_rows`, :func:`process_local`)
and :func:`global_batch` assembles the global ``jax.Array`` with
``jax.make_array_from_process_local_data``; the state is created sharded by
:meth:`purax.parallel.ShardedPlan.init_state` (the same computation on every process).
Only process 0 writes logs (:func:`is_main_process`).

Example: every process first calls
``parallel.distributed.initialize('10.0.0.1:1234', num_processes=2, process_id=i)``
(``i`` = 0, 1), then runs the same program on its rows of each global
batch; with one process (as here) the rows are all of them:

  >>> mesh, rules = parallel.make_mesh(data=-1), parallel.data_parallel()
  >>> rows = parallel.distributed.process_rows(mesh, rules, 64)   # global batch size 64
  >>> local = {k: v[rows] for k, v in batch.items()}               # this process's rows
  >>> on_mesh = parallel.distributed.global_batch(local, mesh, rules)
  >>> on_mesh['x'].shape                                           # the global batch
  (64, 8, 8, 1)
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import signal
import threading
import time
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from purax.core.errors import ConfigError, DataError, expect
from purax.parallel.rules import Rules, batch_spec

#: Environment variables read when an argument is not given (first set wins).
ENV = {
    'coordinator': ('PURAX_COORDINATOR', 'JAX_COORDINATOR_ADDRESS'),
    'num_processes': ('PURAX_NUM_PROCESSES', 'JAX_NUM_PROCESSES'),
    'process_id': ('PURAX_PROCESS_ID', 'JAX_PROCESS_ID'),
}

_started: tuple | None = None

#: Exit status of a process whose peer was lost (EX_TEMPFAIL: resume the run).
PEER_LOST_STATUS = 75
#: Seconds without a sign of life after which a peer is lost (the default of
#: ``initialize(heartbeat_timeout_s=None)``; ``PURAX_HEARTBEAT_TIMEOUT`` overrides).
HEARTBEAT_TIMEOUT_S = 30


def _from_env(name: str):
  for var in ENV[name]:
    if os.environ.get(var):
      return os.environ[var], var
  return None, None


def _as_int(values: dict, name: str, field: str) -> int:
  """``values[name]`` as an integer; ``field`` names it (and where it came from)."""
  value = values[name]
  if value is None:
    given = ', '.join(f'{k}={v!r}' for k, v in values.items() if v is not None)
    raise ConfigError(
        f'{field}: expected an integer with {given} (the argument, --{name.replace("_", "-")} '
        f'or one of {", ".join(ENV[name])}), got unset')
  try:
    return int(value)
  except (TypeError, ValueError):
    raise ConfigError(f'{field}: expected an integer, got {value!r}') from None


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *,
               local_device_ids: int | list[int] | None = None,
               timeout_s: int = 300, heartbeat_timeout_s: float | None = None) -> bool:
  """Connects this process to the others (``jax.distributed.initialize``).

  Call it first, before anything touches a device. Missing arguments are read
  from the environment (:data:`ENV`: ``PURAX_COORDINATOR`` or
  ``JAX_COORDINATOR_ADDRESS``, ``PURAX_NUM_PROCESSES`` or ``JAX_NUM_PROCESSES``,
  ``PURAX_PROCESS_ID`` or ``JAX_PROCESS_ID``). With none of them set, and
  ``num_processes`` unset or 1, it does nothing (a single-process run).
  Idempotent: calling it again with the same values does nothing.

  Args:
    coordinator: ``'HOST:PORT'`` of process 0's coordination service, or
      ``'auto'``: jax's cluster detection (SLURM, Open MPI, Kubernetes/GKE)
      supplies it and the count and id (``purax train --coordinator auto``).
    num_processes: number of processes (>= 1).
    process_id: this process's index in ``[0, num_processes)``.
    local_device_ids: restrict this process to these local devices.
    timeout_s: seconds to wait for all processes to connect.
    heartbeat_timeout_s: a process silent this long is lost: every other
      process prints ``purax: process I: lost process J ...`` and exits with
      :data:`PEER_LOST_STATUS` (see :func:`watch_peers`). Unset:
      ``PURAX_HEARTBEAT_TIMEOUT`` or :data:`HEARTBEAT_TIMEOUT_S`.

  Returns:
    True if this call started the distributed runtime, False otherwise.

  Raises:
    ConfigError: a malformed address, an out-of-range count or id (naming the
      field and where it came from), or a second call with other values.
  """
  global _started
  sources = {}
  values = {'coordinator': coordinator, 'num_processes': num_processes,
            'process_id': process_id}
  for name in values:
    if values[name] is None:
      values[name], sources[name] = _from_env(name)
    else:
      sources[name] = 'argument'
  if values['num_processes'] is None and values['coordinator'] is None:
    return False
  heartbeat_timeout_s = _heartbeat_timeout(heartbeat_timeout_s)
  if values['coordinator'] == 'auto':
    return _initialize_from_cluster(local_device_ids, timeout_s, heartbeat_timeout_s)
  field = lambda name: f'{name} (from {sources[name] or "nowhere: not set"})'
  n = _as_int(values, 'num_processes', field('num_processes'))
  expect(n >= 1, field('num_processes'), '>= 1', n, ConfigError)
  if n == 1 and values['coordinator'] is None:
    return False
  addr = values['coordinator']
  expect(isinstance(addr, str) and re.fullmatch(r'[^:\s]+:\d{1,5}', addr) is not None,
         field('coordinator'), "'HOST:PORT'", repr(addr), ConfigError)
  pid = _as_int(values, 'process_id', field('process_id'))
  expect(0 <= pid < n, field('process_id'), f'in [0, {n})', pid, ConfigError)
  key = (addr, n, pid)
  if _started is not None or jax.distributed.is_initialized():
    expect(_started in (None, key), 'distributed.initialize',
           f'the values it was first called with {_started}', key, ConfigError)
    return False
  # CPU devices of different processes talk over gloo (the default today; set
  # explicitly so that a changed default does not silently break CPU runs).
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address=addr, num_processes=n, process_id=pid,
                             local_device_ids=local_device_ids,
                             initialization_timeout=timeout_s,
                             heartbeat_timeout_seconds=_jax_heartbeat(heartbeat_timeout_s))
  _started = key
  watch_peers(heartbeat_timeout_s)
  return True


def _initialize_from_cluster(local_device_ids, timeout_s: int, heartbeat_timeout_s: int
                             ) -> bool:
  """``coordinator='auto'``: jax's own cluster detection (SLURM, Open MPI,
  Kubernetes/GKE, Cloud TPU) supplies the address, the count and the id."""
  global _started
  if _started is not None or jax.distributed.is_initialized():
    expect(_started in (None, 'auto'), 'distributed.initialize',
           f'the values it was first called with {_started}', 'auto', ConfigError)
    return False
  from jax._src import clusters   # the registry jax.distributed.initialize() consults
  detected = [c.__name__ for c in clusters.ClusterEnv._cluster_types  # pylint: disable=protected-access
              if not c.opt_in_only_method and c.is_env_present()]
  expect(bool(detected), 'coordinator', "'auto' inside a cluster jax detects (SLURM, Open "
         'MPI, Kubernetes/GKE, Cloud TPU: their environment variables)',
         "'auto' with none detected", ConfigError)
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(local_device_ids=local_device_ids,
                             initialization_timeout=timeout_s,
                             heartbeat_timeout_seconds=_jax_heartbeat(heartbeat_timeout_s))
  _started = 'auto'
  watch_peers(heartbeat_timeout_s)
  return True


def _heartbeat_timeout(value: float | None) -> float:
  if value is None:
    env = os.environ.get('PURAX_HEARTBEAT_TIMEOUT')
    try:
      value = float(env) if env else HEARTBEAT_TIMEOUT_S
    except ValueError:
      raise ConfigError(f'PURAX_HEARTBEAT_TIMEOUT: expected seconds, got {env!r}') from None
  expect(value > 0, 'heartbeat_timeout_s', '> 0', value, ConfigError)
  return float(value)


def _jax_heartbeat(timeout_s: float) -> int:
  """jax's own heartbeat timeout: later than purax's, so that the coordination
  service's abort (SIGABRT, a C++ stack trace) never comes first."""
  return int(2 * timeout_s + 10)


# --- Peer loss: a watchdog through the coordination service's key-value store.

_watch: dict = {}


def _lost(me: int, who: str, silent_s: float) -> None:
  """Prints the purax message and ends this process at once with
  :data:`PEER_LOST_STATUS` (no collective, no C++ abort)."""
  message = (f'purax: process {me}: lost {who} (no sign of life for {silent_s:.0f} s: it '
             f'died or hangs); exiting with status {PEER_LOST_STATUS}. Checkpoints '
             f'committed before stay readable: run the same command again to resume.\n')
  try:
    os.write(2, message.encode())
  finally:
    os._exit(PEER_LOST_STATUS)   # pylint: disable=protected-access


def _exchange(client, me: int, beats: dict, period_s: float, stop: threading.Event) -> None:
  """The watchdog's talk with the service (its own thread: a call to a dead
  service can block for long, and the verdict must not wait for it). Records
  when the service last answered and when each peer's counter last moved,
  until ``stop`` is set: as the time each call was made, not when it returned
  (a call made before the service died may return late on a loaded machine,
  and the verdict must not move past the wait an abort gives it)."""
  beat = 0
  while not stop.is_set():
    beat += 1
    sent = time.monotonic()
    try:
      client.key_value_set(f'purax/alive/{me}', str(beat), allow_overwrite=True)
      beats['service'] = sent
    except Exception:   # the service (process 0) unreachable
      pass
    for i, (value, _) in list(beats['peers'].items()):
      asked = time.monotonic()
      try:
        new = client.key_value_try_get(f'purax/alive/{i}')
      except Exception:   # not yet set, or the service unreachable
        continue
      if new != value:
        beats['peers'][i] = (new, asked)
    stop.wait(period_s)


def _watchdog(client, me: int, n: int, timeout_s: float, period_s: float,
              stop: threading.Event) -> None:
  start = time.monotonic()
  beats = {'service': start, 'peers': {i: (None, start) for i in range(n) if i != me}}
  exchange = threading.Thread(target=_exchange, name='purax-peer-exchange', daemon=True,
                              args=(client, me, beats, period_s, stop))
  _watch['exchange'] = exchange
  exchange.start()
  while not stop.wait(period_s):
    now = time.monotonic()
    if now - beats['service'] > timeout_s:
      _lost(me, 'process 0 (the coordination service)', now - beats['service'])
    for i, (_, since) in list(beats['peers'].items()):
      if now - since > timeout_s:
        _lost(me, f'process {i}', now - since)


def watch_peers(timeout_s: float) -> None:
  """Starts this process's watchdog (a daemon thread; once): every
  ``timeout_s / 10`` s it writes its own counter to the coordination service's
  key-value store and reads the others' (from a thread of its own: a call to a
  dead service may block, and must not hold the verdict back). A process whose
  counter has not moved for ``timeout_s`` (or the service itself unreachable
  that long: process 0 lost) ends this one with a purax message naming it and
  :data:`PEER_LOST_STATUS`, before jax's own heartbeat (``2 * timeout_s + 10``)
  would abort it. A C++ abort in the meantime (gloo, when a peer's connection
  breaks mid-collective) waits up to ``timeout_s`` plus three periods for that
  verdict (:func:`await_verdict`) instead of dumping core.
  """
  if _watch or jax.process_count() == 1:
    return
  from jax._src import distributed as _distributed   # the coordination client
  client = _distributed.global_state.client
  period_s = max(0.1, timeout_s / 10)
  stop = threading.Event()
  _watch.update(timeout_s=timeout_s, period_s=period_s, stop=stop)
  threading.Thread(target=_watchdog, name='purax-peer-watchdog', daemon=True,
                   args=(client, jax.process_index(), jax.process_count(), timeout_s,
                         period_s, stop)).start()
  # Registered after jax's own exit handler (it disconnects the client), so it
  # runs first: no watchdog call to the service is made or judged once the
  # process ends.
  atexit.register(_stop_watching)
  _hook_abort()
  _hook_terminate()


def _stop_watching() -> None:
  """Stops the watchdog and waits (at most two periods) for a call to the
  service it has in flight, before the client is disconnected."""
  _watch['stop'].set()
  exchange = _watch.get('exchange')
  if exchange is not None:
    exchange.join(timeout=2 * _watch['period_s'])


def await_verdict() -> None:
  """After a failure in a multi-host run: waits (at most the heartbeat timeout
  and three periods) for the watchdog to decide whether a peer was lost; if so it
  ends the process (:func:`watch_peers`); otherwise this returns, and the
  failure is this process's own."""
  if not _watch:
    return
  deadline = time.monotonic() + _watch['timeout_s'] + 3 * _watch['period_s']
  while time.monotonic() < deadline:
    time.sleep(_watch['period_s'])


_ABORT_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)


def _hook_abort() -> None:
  """SIGABRT (a C++ thread's std::terminate or LOG(FATAL)) waits for the
  watchdog's verdict first: a lost peer exits with the purax message; any
  other abort proceeds as before, a few seconds later."""
  previous = signal.getsignal(signal.SIGABRT)
  if previous not in (signal.SIG_DFL, None):
    return   # someone else's handler: left alone
  def on_abort(_signum):
    await_verdict()   # returns: abort() goes on (default action)
  handler = _ABORT_HANDLER(on_abort)
  libc = ctypes.CDLL(None, use_errno=True)
  libc.signal.restype = ctypes.c_void_p
  libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
  libc.signal(signal.SIGABRT, ctypes.cast(handler, ctypes.c_void_p))
  _watch['abort_handler'] = handler   # kept alive


_TERMINATE_HANDLER = ctypes.CFUNCTYPE(None)


def _hook_terminate() -> None:
  """``std::terminate`` (gloo throwing on a connection a dead peer broke
  mid-message) waits for the watchdog's verdict before the C++ runtime's own
  handler prints ``terminate called after throwing ...`` and aborts: a lost
  peer exits with the purax message alone; any other failure is printed and
  aborts as before. Nothing where the C++ runtime is not libstdc++."""
  try:
    set_terminate = ctypes.CDLL('libstdc++.so.6')._ZSt13set_terminatePFvvE
  except (OSError, AttributeError):
    return
  set_terminate.restype = ctypes.c_void_p
  set_terminate.argtypes = (ctypes.c_void_p,)
  previous = []

  def on_terminate():
    await_verdict()   # ends the process when a peer was lost
    if previous[0]:
      _TERMINATE_HANDLER(previous[0])()   # prints what was thrown, aborts
    os.abort()

  handler = _TERMINATE_HANDLER(on_terminate)
  previous.append(set_terminate(ctypes.cast(handler, ctypes.c_void_p)))
  _watch['terminate_handler'] = handler   # kept alive


def agree(name: str, value: str, *, timeout_s: int = 30) -> list[str]:
  """Every process's ``value`` for ``name``, through the coordination service's
  key-value store: bounded in time and no collective, so a process that failed
  before reaching this point is named instead of waited for.

  Returns:
    The values of processes ``0 .. process_count - 1`` (``[value]`` alone).

  Raises:
    ConfigError: a process did not give its value within ``timeout_s``.
  """
  if jax.process_count() == 1:
    return [value]
  from jax._src import distributed as _distributed   # the coordination client
  client = _distributed.global_state.client
  client.key_value_set(f'purax/{name}/{jax.process_index()}', value)
  values = []
  for i in range(jax.process_count()):
    try:
      values.append(client.blocking_key_value_get(f'purax/{name}/{i}', timeout_s * 1000))
    except Exception as e:   # jax raises its own status error on a timeout: named here
      raise ConfigError(f'process {i}: expected at {name!r} within {timeout_s} s, got no '
                        f'answer (it failed or hangs; its log says why): {e}') from None
  return values


def shutdown() -> None:
  """Disconnects (``jax.distributed.shutdown``); a no-op if not connected."""
  global _started
  if jax.distributed.is_initialized():
    jax.distributed.shutdown()
  _started = None


def is_main_process() -> bool:
  """Whether this is process 0, the one that writes logs and checkpoints' metadata."""
  return jax.process_index() == 0


def _batch_sharding(mesh: Mesh, rules: Rules, global_batch_size: int) -> NamedSharding:
  rules.check(mesh)
  return NamedSharding(mesh, batch_spec((global_batch_size,), mesh, rules))


def process_rows(mesh: Mesh, rules: Rules, global_batch_size: int) -> slice:
  """The rows ``[start, stop)`` of every global batch that this process feeds.

  Read from the batch sharding's addressable devices, so it holds for any mesh
  whose devices of one process hold a contiguous block of the batch (true for
  :func:`~purax.parallel.make_mesh`, which orders devices by process).

  Raises:
    DataError: the global batch size does not divide over the batch axes, or
      this process's rows are not contiguous (a hand-made mesh interleaving
      processes along the batch axes).
  """
  sharding = _batch_sharding(mesh, rules, global_batch_size)
  spans = {(s[0].start or 0, global_batch_size if s[0].stop is None else s[0].stop)
           for s in sharding.addressable_devices_indices_map((global_batch_size,)).values()}
  start, stop = min(a for a, _ in spans), max(b for _, b in spans)
  expect(sum(b - a for a, b in spans) == stop - start, 'mesh',
         "devices of one process holding contiguous rows of the batch", sorted(spans),
         DataError)
  return slice(start, stop)


def global_batch(local: Any, mesh: Mesh, rules: Rules) -> Any:
  """The global batch ``jax.Array``s from this process's rows (``[rows, ...]``).

  Args:
    local: this process's rows of the global batch (any pytree of numpy or
      jax arrays ``[rows, ...]``); ``process_rows`` says which.
    mesh, rules: as for the step.

  Returns:
    The same pytree of ``[global_batch, ...]`` arrays, sharded along the batch axes.

  Raises:
    DataError: local arrays with different leading sizes, or sizes that do
      not fit the batch axes.
  """
  rules.check(mesh)
  sizes = {jax.tree_util.keystr(path): jax.numpy.shape(v)[0]
           for path, v in jax.tree_util.tree_flatten_with_path(local)[0]}
  expect(len(set(sizes.values())) == 1, 'local batch', 'arrays of one leading size',
         sizes)
  n_local = next(iter(sizes.values()))
  blocks = max(1, batch_spec_size(mesh, rules))
  probe = _batch_sharding(mesh, rules, blocks)
  mine = len({s[0].start for s in probe.addressable_devices_indices_map((blocks,)).values()})
  expect(n_local % mine == 0, 'local batch size', f'a multiple of {mine} (local shards)',
         n_local)
  total = n_local * blocks // mine

  def assemble(v):
    shape = (total, *jax.numpy.shape(v)[1:])
    sharding = NamedSharding(mesh, batch_spec(shape, mesh, rules))
    return jax.make_array_from_process_local_data(sharding, v, shape)

  return jax.tree.map(assemble, local)


def batch_spec_size(mesh: Mesh, rules: Rules) -> int:
  """Number of pieces the batch axis is split into (product of the batch axes)."""
  size = 1
  for a in rules.batch_axes:
    size *= mesh.shape[a]
  return size


def process_local(dataset, mesh: Mesh, rules: Rules, global_batch_size: int):
  """A grain dataset of global batches -> this process's rows of each.

  ``dataset[s]`` is the global batch of step ``s`` (e.g.
  :func:`purax.io.pipeline.train_dataset`); the result's ``[s]`` holds only
  rows :func:`process_rows`, ready for :func:`global_batch`. Random access
  by step is kept, so resume stays exact.
  """
  rows = process_rows(mesh, rules, global_batch_size)
  return dataset.map(lambda batch: {k: v[rows] for k, v in batch.items()})
