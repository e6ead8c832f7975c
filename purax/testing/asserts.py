"""Assertions (chex only) that two steps train alike: the mesh, pmap and
any-two-steps forms, all through one runner (``_run``)."""

import dataclasses
import functools
from typing import Any, Callable, Mapping, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from purax.core.hparams import get as hyperparams
from purax.core.state import TrainState
from purax.core.task import Task
from purax.parallel import spmd
from purax.parallel.rules import Rules
from purax.parallel.shard import replicated
from purax.plan.sharded import sharded


@dataclasses.dataclass(frozen=True)
class Tolerance:
  """``|actual - expected| <= atol + rtol * |expected|``, elementwise."""

  rtol: float
  atol: float


#: Default tolerances of the parallel-equivalence assertions (see module doc).
TOLERANCES: dict[str, Tolerance] = {
    'loss': Tolerance(rtol=1e-5, atol=1e-6),         # one reduction over the batch
    'grads': Tolerance(rtol=1e-4, atol=1e-6),        # per-device sums + all-reduce
    'params': Tolerance(rtol=1e-4, atol=1e-5),       # after k Adam steps
    'model_state': Tolerance(rtol=1e-4, atol=1e-5),  # BatchNorm running statistics
    'opt_state': Tolerance(rtol=1e-4, atol=1e-5),    # Adam moments, counters
}


def _is_key(x) -> bool:
  return isinstance(x, (jax.Array, np.ndarray)) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _chex(check: Callable, *args, name: str, detail: str = '', **kwargs) -> None:
  """Runs a chex assertion; its failure is re-raised naming the leaf path
  (chex names the path inside the tree it was given, not the caller's)."""
  try:
    check(*args, **kwargs)
  except AssertionError as e:
    raise AssertionError(f'{name}: {detail or "differs"}\n{e}') from None


def assert_trees_close(actual: Any, expected: Any, tol: Tolerance, *, what: str = 'tree'):
  """Same structure, shapes, dtypes and values within ``tol``, leaf by leaf.

  Built on chex (``assert_trees_all_equal_structs``,
  ``assert_trees_all_equal_shapes_and_dtypes``, ``assert_trees_all_close``,
  ``assert_trees_all_equal``), extended where chex falls short:

  - typed PRNG keys (chex cannot convert them to numpy) compare by
    implementation and key data, exactly;
  - floating leaves compare in float64 (chex 0.1.92 upcasts bfloat16 to
    float32 only; in float64 the tolerance arithmetic ``atol + rtol * |e|``
    itself does not round);
  - integers and booleans exactly; ``None`` is structure (both sides must
    have it at the same place); a Python scalar (e.g. flax TrainState's
    ``step`` outside jit) has no dtype of its own: only its value compares;
  - every failure names the leaf's full path prefixed by ``what`` (e.g.
    ``step 2 state.params['Dense_0']['kernel']``) and, for floats, the
    largest difference; chex's own report follows.

  Raises:
    AssertionError: naming the leaf path, the largest difference and the tolerance.
  """
  _chex(chex.assert_trees_all_equal_structs, actual, expected, name=what,
        detail='structure differs from the expected structure')
  a_leaves = jax.tree_util.tree_flatten_with_path(actual)[0]
  e_leaves = jax.tree.leaves(expected)
  for (path, a), e in zip(a_leaves, e_leaves):
    name = f'{what}{jax.tree_util.keystr(path)}'
    if _is_key(a) or _is_key(e):
      assert _is_key(a) and _is_key(e), f'{name}: a typed PRNG key on one side only ({a!r} vs {e!r})'
      a_impl, e_impl = str(jax.random.key_impl(a)), str(jax.random.key_impl(e))
      assert a_impl == e_impl, f'{name}: key implementation {a_impl} != expected {e_impl}'
      a_data, e_data = np.asarray(jax.random.key_data(a)), np.asarray(jax.random.key_data(e))
      _chex(chex.assert_trees_all_equal, a_data, e_data, name=name,
            detail=f'PRNG key data {a_data.tolist()} != expected {e_data.tolist()}')
      continue
    weak = isinstance(a, (int, float, bool)) or isinstance(e, (int, float, bool))
    a, e = np.asarray(a), np.asarray(e)
    if weak:
      a, e = a.astype(np.float64), e.astype(np.float64)
    _chex(chex.assert_trees_all_equal_shapes_and_dtypes, a, e, name=name,
          detail=(f'shape {a.shape} != expected {e.shape}' if a.shape != e.shape else
                  f'dtype {a.dtype} != expected {e.dtype}'))
    if not jnp.issubdtype(a.dtype, jnp.inexact):
      differ = np.argwhere(a != e) if a.ndim else np.zeros((int(a != e), 0), int)
      first = tuple(differ[0]) if len(differ) else ()
      _chex(chex.assert_trees_all_equal, a, e, name=name,
            detail=f'{a.dtype} values differ at {differ[:3].tolist()} '
                   f'({a[first] if len(differ) else ""} vs {e[first] if len(differ) else ""})')
      continue
    wide = np.complex128 if jnp.issubdtype(a.dtype, jnp.complexfloating) else np.float64
    a64, e64 = a.astype(wide), e.astype(wide)
    with np.errstate(invalid='ignore'):   # inf - inf: equal infinities are no difference
      delta = np.abs(a64 - e64)
    diff = np.nanmax(delta) if a64.size and not np.isnan(delta).all() else 0.0
    _chex(chex.assert_trees_all_close, a64, e64, rtol=tol.rtol, atol=tol.atol, name=name,
          detail=f'max |actual - expected| = {diff:.3g} exceeds '
                 f'atol={tol.atol:g} + rtol={tol.rtol:g} * |expected|')


def assert_finite(tree: Any, *, what: str = 'tree') -> None:
  """Every floating leaf is finite: ``chex.assert_tree_all_finite`` over a
  tree that may hold typed PRNG keys (chex cannot read them; they are skipped)
  and bfloat16 leaves.

  Raises:
    AssertionError: naming ``what`` and the paths of the non-finite leaves.
  """
  floats = jax.tree.map(lambda x: None if _is_key(x) or not jnp.issubdtype(
      np.asarray(x).dtype, jnp.inexact) else np.asarray(x), tree)
  _chex(chex.assert_tree_all_finite, floats, name=what, detail='non-finite values')


def grads_of(task: Task, state: TrainState, batch: Any):
  """The gradients ``task.step`` applies to ``batch`` (:meth:`purax.Task.gradients`:
  microbatches accumulated, the loss scale removed; pure, jittable)."""
  return task.gradients(state, batch)[0]


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def learning_rate_of(state: Any) -> float | None:
  """The largest injected learning rate of a state (``opt_state.hyperparams``), or None."""
  if not hasattr(state, 'opt_state'):
    return None
  rates = [float(np.max(np.asarray(v))) for k, v in hyperparams(state).items()
           if 'learning_rate' in k]
  return max(rates) if rates else None


def _record(state: Any, metrics: Any, grads: Any) -> dict:
  """A host copy of what is compared (the device state may be donated next)."""
  loss = metrics.get('loss') if isinstance(metrics, Mapping) else None
  loss = getattr(loss, 'total', loss)
  return jax.device_get({'state': state, 'loss': loss, 'grads': grads})


def _fields(state) -> list[tuple[str, Any]]:
  """``(name, subtree)`` pairs to compare: a dataclass or flax struct field by
  field, anything else as one tree."""
  if dataclasses.is_dataclass(state):
    return [(f'.{f.name}', getattr(state, f.name)) for f in dataclasses.fields(state)
            if f.metadata.get('pytree_node', True)]
  return [('', state)]


def _tolerance_of(field: str, tolerances) -> Tolerance:
  for name in ('model_state', 'params', 'opt_state'):
    if field == f'.{name}':
      return tolerances.get(name, tolerances['params'])
  return tolerances.get('state', tolerances['params'])


def _compare_runs(reference: list, actual: list, tolerances, learning_rate: float | None):
  for i, (ref, got) in enumerate(zip(reference, actual)):
    where = f'step {i + 1}'
    # NaN equals NaN in the comparisons below: a reference run that diverged
    # would match any other that diverged, so it must stay finite.
    assert_finite(ref['state'], what=f'{where} reference state')
    if got['loss'] is not None and ref['loss'] is not None:
      assert_trees_close(got['loss'], ref['loss'], tolerances['loss'], what=f'{where} loss sum')
    if got['grads'] is not None and ref['grads'] is not None:
      assert_trees_close(got['grads'], ref['grads'], tolerances['grads'],
                         what=f'{where} grads')
    for field, ref_tree in _fields(ref['state']):
      tol = _tolerance_of(field, tolerances)
      if learning_rate and field in ('.params', ''):
        # Adam turns rounding noise in a (structurally) zero gradient into a
        # full +-lr step: allow 2 * lr per step taken (see the module doc).
        tol = dataclasses.replace(tol, atol=tol.atol + 2 * learning_rate * (i + 1))
      got_tree = dict(_fields(got['state'])).get(field)
      assert_trees_close(got_tree, ref_tree, tol, what=f'{where} state{field}')


def _step_and_grads(task: Task, state: TrainState, batch: Any):
  """``(state, metrics, grads)``: the step and the gradients it applies in one
  program (XLA merges the two identical backward passes: the same flops as
  the step alone), one compilation per placement."""
  grads = grads_of(task, state, batch)
  return (*task.step(state, batch), grads)


#: XLA options of the programs the assertions compile on a CPU: LLVM at -O0
#: and the elemental IR emitter in place of the MLIR fusion emitters compile a
#: small step 3-4x faster, and a test's two steps do not feel the slower code.
#: The HLO passes (SPMD partitioning, collectives, fusion decisions) are XLA's
#: defaults, so what is compared is the program that trains; only the machine
#: code differs, alike on both sides. Empty on other platforms.
CPU_COMPILER_OPTIONS = {'xla_backend_optimization_level': 0,
                        'xla_cpu_use_fusion_emitters': False}


def _jit(fun: Callable, devices, **kwargs):
  options = CPU_COMPILER_OPTIONS if all(d.platform == 'cpu' for d in devices) else None
  return jax.jit(fun, compiler_options=options, **kwargs)


# Compiled functions are cached per (task, mesh, rules, batch shapes): a property
# test drawing the same mesh twice, or parametrized over rules, compiles once.
@functools.lru_cache(maxsize=64)
def _program(task: Task, shapes) -> Callable:
  """``_step_and_grads`` of ``task`` on batches of ``shapes``, traced once (to
  a jaxpr) for every placement: a mesh is part of an array's type, so jit
  would trace the model, loss and optimizer again for each mesh, where
  re-binding the jaxpr's equations is a small part of that."""
  batch = _zeros(shapes, abstract=True)
  state = jax.eval_shape(task.init, jax.random.key(0), batch)
  traced = jax.jit(functools.partial(_step_and_grads, task)).trace(state, batch)
  closed, out_tree = traced.jaxpr, jax.tree.structure(traced.out_info)

  def program(state, batch):
    leaves = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *jax.tree.leaves((state, batch)))
    return jax.tree.unflatten(out_tree, leaves)

  return program


@functools.lru_cache(maxsize=64)
def _single_jits(task: Task, shapes):
  devices = jax.local_devices()[:1]
  return _jit(task.init, devices), _jit(_program(task, shapes), devices)


@functools.lru_cache(maxsize=64)
def _plan(task: Task, mesh, rules: Rules, shapes):
  plan = sharded(task, mesh, rules, _zeros(shapes))
  s_state = plan.state_sharding
  step = _jit(_program(task, shapes), mesh.devices.flat,
              in_shardings=(s_state, plan.batch_sharding),
              out_shardings=(s_state, replicated(mesh), s_state.params))
  return plan, step


def _shapes(batch) -> tuple:
  leaves, treedef = jax.tree.flatten(batch)
  return treedef, tuple((tuple(np.shape(v)), np.asarray(v).dtype.name) for v in leaves)


def _zeros(shapes, *, abstract: bool = False):
  treedef, leaves = shapes
  make = jax.ShapeDtypeStruct if abstract else np.zeros
  return jax.tree.unflatten(treedef, [make(s, d) for s, d in leaves])


def _with_grads(step: Callable, grads: Callable | None) -> Callable:
  """``(state, batch) -> (state, metrics, grads)`` of a step and, before it, a
  gradient function (None: no gradients compared)."""
  def run(state, batch):
    g = grads(state, batch) if grads is not None else None
    return (*step(state, batch), g)
  return run


def _run(step: Callable, state: Any, batches: Sequence[Any], *,
         place: Callable = lambda batch: batch, host: Callable = lambda tree: tree) -> list:
  """The one runner of every form: ``step`` (``(state, batch) -> (state,
  metrics, grads)``, the gradients those the step applies, or None) over
  ``batches`` (each placed by ``place``), recording after each step the
  state, the loss and the gradients, copied to the host in one transfer
  (``host`` first: e.g. unreplicate a pmap state)."""
  out = []
  for batch in batches:
    state, metrics, grads = step(state, place(batch))
    out.append(_record(*host((state, metrics, grads))))
  return out


def _single_device_run(task: Task, state: TrainState, batches) -> list:
  return _run(_single_jits(task, _shapes(batches[0]))[1], state, batches)


def _learning_rate(learning_rate, state):
  return learning_rate_of(state) if learning_rate == 'auto' else learning_rate


def assert_step_matches_single_device(task: Task, mesh: jax.sharding.Mesh, rules: Rules,
                                      batches: Sequence[Any], *,
                                      key: jax.Array | None = None,
                                      tolerances: Mapping[str, Tolerance] | None = None,
                                      learning_rate: float | str | None = None):
  """``k = len(batches)`` steps on ``mesh`` under ``rules`` equal ``k`` single-device steps.

  After every step: the loss (summed over the global batch), the gradients
  (``grads_of``, computed with the plan's shardings), and every field of the
  state — params, optimizer state, model state (BatchNorm statistics), rng,
  step — are compared within ``tolerances`` (default :data:`TOLERANCES`).
  Both runs start from ``task.init(key, batch)``, the sharded one that state
  placed in the plan's shardings (``jax.device_put``). Each side is one
  program (the step and its gradients), compiled once per task (one device)
  and per (task, mesh, rules, batch shapes): a property test that draws a
  mesh again, or the same task under other rules, does not recompile.

  Args:
    learning_rate: with Adam, a gradient entry that is structurally zero
      (e.g. an unused class's bias) is rounding noise whose sign Adam turns
      into a full ``+-lr`` step; pass the learning rate (or ``'auto'``: the
      largest injected one) to widen the params tolerance by ``2 * lr`` per
      step. Default None: no widening.

  Raises:
    AssertionError: naming the step, the quantity and the leaf that differ.
  """
  tolerances = {**TOLERANCES, **(tolerances or {})}
  key = jax.random.key(0) if key is None else key
  ref_state = _single_jits(task, _shapes(batches[0]))[0](key, batches[0])
  lr = _learning_rate(learning_rate, ref_state)
  ref = _single_device_run(task, ref_state, batches)
  plan, step = _plan(task, mesh, rules, _shapes(batches[0]))
  got = _run(step, jax.device_put(ref_state, plan.state_sharding, may_alias=False), batches,
             place=plan.shard_batch)
  _compare_runs(ref, got, tolerances, lr)


@functools.lru_cache(maxsize=16)
def _pmap_grads(task: Task, devices: tuple):
  """The gradients the pmap step applies (summed across devices), per device."""
  local = spmd.with_axis_name(task, 'batch')

  def grads(state, batch):
    index = jax.lax.axis_index('batch')
    state = state.replace(rng=jax.random.fold_in(state.rng, index))
    return local.gradients(state, batch, axis_name='batch')[0]

  return jax.pmap(grads, axis_name='batch', devices=list(devices))


def assert_pmap_matches_jit(task: Task, batches: Sequence[Any], *,
                            num_devices: int | None = None, key: jax.Array | None = None,
                            tolerances: Mapping[str, Tolerance] | None = None,
                            learning_rate: float | str | None = None):
  """``k`` steps of :func:`purax.parallel.pmap_step` equal ``k`` single-device jitted steps.

  Compares, after every step, the loss, the gradients the step applies
  (after the cross-device sum) and every field of the state. The task must
  be deterministic (no dropout): pmap draws a distinct dropout key per device
  by design. ``learning_rate`` as in :func:`assert_step_matches_single_device`.

  Raises:
    AssertionError: naming the step, the quantity and the leaf that differ.
  """
  tolerances = {**TOLERANCES, **(tolerances or {})}
  key = jax.random.key(0) if key is None else key
  n = num_devices or jax.local_device_count()
  devices = tuple(jax.local_devices()[:n])
  state = _single_jits(task, _shapes(batches[0]))[0](key, batches[0])
  lr = _learning_rate(learning_rate, state)
  pstate = spmd.replicate(state, n)
  ref = _single_device_run(task, _copy(state), batches)
  got = _run(_with_grads(spmd.pmap_step(task, devices=list(devices)), _pmap_grads(task, devices)),
             pstate, batches, place=lambda b: spmd.split_batch(b, n), host=spmd.unreplicate)
  _compare_runs(ref, got, tolerances, lr)


def assert_same_training(step_a: Callable, state_a: Any, step_b: Callable,
                         state_b: Any, batches: Sequence[Any], *,
                         tolerances: Mapping[str, Tolerance] | None = None,
                         learning_rate: float | str | None = None, resync: bool = False):
  """Two step functions train alike over ``batches``: any steps, any state pytrees.

  ``step_x(state, batch) -> (state, metrics)`` (each with its own placement:
  jit, a mesh, ``pmap``...). After every step the whole states are compared
  leaf by leaf — a purax :class:`TrainState`, a flax ``TrainState``, a dict;
  typed keys, bfloat16, integers, booleans and ``None`` included — with
  ``tolerances['params']`` for a state that is not a dataclass, per field
  (``params``, ``opt_state``, ``model_state``; other fields ``'state'``,
  default the params tolerance) for one that is; ``metrics['loss']`` too
  when both steps return a dict with one. ``learning_rate`` as in
  :func:`assert_step_matches_single_device`. ``resync=True`` puts run A's
  state into run B's placement before every step (both steps then start
  from the same values), so each step is compared on its own and rounding
  differences do not compound over many Adam steps.

  Raises:
    AssertionError: naming the step, the field path and the difference, e.g.
      ``step 1 state.rng: PRNG key data [0, 1] != expected [0, 2]``.
  """
  tolerances = {**TOLERANCES, **(tolerances or {})}
  assert len(batches) >= 1, 'batches: expected at least one batch to compare a step on, got none'
  lr = _learning_rate(learning_rate, state_a)
  if not resync:
    ra = _run(_with_grads(step_a, None), state_a, batches)
    rb = _run(_with_grads(step_b, None), state_b, batches)
    _compare_runs(ra, rb, tolerances, lr)
    return
  ra, rb = [], []
  for i, batch in enumerate(batches):   # interleaved: B starts each step from A's values
    if i:
      state_b = jax.tree.map(lambda a, b: jax.device_put(jnp.copy(a), b.sharding)
                             if isinstance(b, jax.Array) else a, state_a, state_b)
    state_a, ma = step_a(state_a, batch)
    state_b, mb = step_b(state_b, batch)
    ra.append(_record(state_a, ma, None))
    rb.append(_record(state_b, mb, None))
  _compare_runs(ra, rb, tolerances, None)
