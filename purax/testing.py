"""Hypothesis strategies and assertions that prove a parallel step is the single-device step.

Use them on your own tasks::

  from hypothesis import given, strategies as st
  from purax import parallel, testing

  @given(shape=testing.mesh_shapes(), data=st.data())
  def test_my_task_fsdp(shape, data):
    mesh = testing.mesh_of(shape)
    batch_size = data.draw(testing.batch_sizes(mesh))
    batches = data.draw(testing.classification_batches(batch_size, (8,), 4, steps=2))
    with jax.default_matmul_precision('highest'):
      testing.assert_step_matches_single_device(my_task, mesh, parallel.fsdp(), batches)

Tolerances (:data:`TOLERANCES`) assume float32 at ``highest`` matmul
precision on CPU. A sharded step differs from the single-device one only in
the order of its floating-point sums (a partial sum per device, then an
all-reduce): relative error ``~ batch * 2**-24``, a few ``1e-6`` for the
batches here. Adam divides by ``sqrt(nu)``, which can amplify the difference
of a gradient entry near 0 to a fraction of the learning rate, so parameters
after ``k`` steps get an absolute tolerance of ``1e-5`` (for learning rates
<= 1e-2 and a few steps). Nothing is compared bitwise across meshes.

Strategies touch devices only when drawn, never at import.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from purax.core.state import TrainState
from purax.core.task import Task
from purax.parallel.mesh import AXES, make_mesh
from purax.parallel.rules import Rules, data_parallel
from purax.parallel.step import sharded
from purax.parallel import spmd

__all__ = [
    'TOLERANCES', 'Tolerance', 'mesh_shapes', 'mesh_of', 'meshes', 'batch_sizes',
    'classification_batches', 'small_pytrees', 'assert_trees_close', 'grads_of',
    'assert_step_matches_single_device', 'assert_pmap_matches_jit', 'assert_same_training',
]


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
}


# -- strategies --

def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def mesh_shapes(draw, num_devices: int | None = None,
                axes: Sequence[str] = AXES) -> dict[str, int]:
  """Mesh axis sizes ``{'data': d, 'fsdp': f, 'tensor': t}`` using a divisor of the devices.

  Args:
    num_devices: devices available (default ``jax.device_count()``, read when drawn).
    axes: the axes that may be larger than 1; the others are 1.

  Shrinks towards small meshes (1 device).
  """
  n = num_devices or jax.device_count()
  total = draw(st.sampled_from(_divisors(n)))
  sizes = {a: 1 for a in AXES}
  rest = total
  for a in axes[:-1]:
    sizes[a] = draw(st.sampled_from(_divisors(rest)))
    rest //= sizes[a]
  sizes[axes[-1]] = rest
  return sizes


def mesh_of(sizes: Mapping[str, int]) -> jax.sharding.Mesh:
  """:func:`purax.parallel.make_mesh` over the first ``prod(sizes)`` devices."""
  devices = jax.devices()[:math.prod(sizes.values())]
  return make_mesh(**sizes, devices=devices)


def meshes(num_devices: int | None = None, axes: Sequence[str] = AXES):
  """Meshes (``jax.sharding.Mesh``) that fit the available devices."""
  return mesh_shapes(num_devices, axes).map(mesh_of)


def batch_sizes(mesh: jax.sharding.Mesh, rules: Rules | None = None,
                max_per_shard: int = 4, *, candidates: Sequence[int] | None = None):
  """Global batch sizes the mesh splits evenly over ``rules.batch_axes``.

  Args:
    mesh, rules: the layout (default rules: data parallel).
    max_per_shard: draw ``k * split`` for ``k`` in ``[1, max_per_shard]``.
    candidates: instead, draw from these sizes those that ``split`` divides
      (fewer distinct shapes: fewer compilations in a property test).
  """
  rules = rules or data_parallel()
  split = math.prod(mesh.shape[a] for a in rules.batch_axes)
  if candidates is not None:
    fits = [b for b in candidates if b % split == 0]
    assert fits, f'no batch size among {candidates} is a multiple of {split}'
    return st.sampled_from(fits)
  return st.integers(1, max_per_shard).map(lambda k: k * split)


@st.composite
def classification_batches(draw, batch_size: int, input_shape: Sequence[int],
                           num_classes: int, steps: int = 1,
                           weighted: bool = False) -> list[dict[str, np.ndarray]]:
  """``steps`` batches ``{'x': float32 [batch, *input_shape], 'y': int32 [batch]}``.

  Values come from a drawn seed (numpy), so examples are cheap to generate and
  to shrink. With ``weighted``, a float32 ``'weight'`` of 0s and 1s (not all 0).
  """
  seed = draw(st.integers(0, 2**16))
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(steps):
    batch = {'x': rng.normal(size=(batch_size, *input_shape)).astype(np.float32),
             'y': rng.integers(0, num_classes, batch_size).astype(np.int32)}
    if weighted:
      w = (rng.random(batch_size) < 0.7).astype(np.float32)
      w[0] = 1.0
      batch['weight'] = w
    out.append(batch)
  return out


def small_pytrees(max_leaves: int = 4, max_dim: int = 8):
  """Dicts of 1 to ``max_leaves`` float32 arrays of rank 0-2, dims ``<= max_dim``."""
  shape = st.lists(st.integers(1, max_dim), min_size=0, max_size=2).map(tuple)

  @st.composite
  def leaf(draw):
    s = draw(shape)
    seed = draw(st.integers(0, 2**16))
    return np.random.default_rng(seed).normal(size=s).astype(np.float32)

  return st.dictionaries(st.text('abcdefgh', min_size=1, max_size=3), leaf(),
                         min_size=1, max_size=max_leaves)


# -- assertions --

def assert_trees_close(actual: Any, expected: Any, tol: Tolerance, *, what: str = 'tree'):
  """Same structure, shapes, dtypes and values within ``tol``, leaf by leaf.

  Raises:
    AssertionError: naming the leaf path, the largest difference and the tolerance.
  """
  a_leaves, a_def = jax.tree_util.tree_flatten_with_path(jax.device_get(actual))
  e_leaves, e_def = jax.tree_util.tree_flatten_with_path(jax.device_get(expected))
  assert a_def == e_def, f'{what}: structure {a_def} != expected {e_def}'
  for (path, a), (_, e) in zip(a_leaves, e_leaves):
    name = f'{what}{jax.tree_util.keystr(path)}'
    a, e = np.asarray(a), np.asarray(e)
    assert a.shape == e.shape, f'{name}: shape {a.shape} != expected {e.shape}'
    assert a.dtype == e.dtype, f'{name}: dtype {a.dtype} != expected {e.dtype}'
    if not np.allclose(a, e, rtol=tol.rtol, atol=tol.atol, equal_nan=True):
      diff = np.max(np.abs(a.astype(np.float64) - e.astype(np.float64)))
      raise AssertionError(f'{name}: max |actual - expected| = {diff:.3g} exceeds '
                           f'atol={tol.atol} + rtol={tol.rtol} * |expected|')


def grads_of(task: Task, state: TrainState, batch: Mapping[str, Any]):
  """The gradient of ``task.loss`` that ``task.step`` would apply (pure, jittable)."""
  grad = jax.grad(lambda p: task.compute_loss(p, state.model_state, batch, state.step_key(),
                                      hparams=state.hparams, train=True)[0])
  return grad(state.params)


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def _record(state: TrainState, metrics, grads) -> dict:
  """A host copy of what is compared (the device state may be donated next)."""
  return jax.device_get({'step': state.step, 'params': state.params,
                         'model_state': state.model_state,
                         'loss': metrics['loss'].total, 'grads': grads})


def _compare_runs(reference: list, actual: list, tolerances):
  for i, (ref, got) in enumerate(zip(reference, actual)):
    where = f'step {i + 1}'
    assert_trees_close(got['loss'], ref['loss'], tolerances['loss'], what=f'{where} loss sum')
    if got['grads'] is not None:
      assert_trees_close(got['grads'], ref['grads'], tolerances['grads'],
                         what=f'{where} grads')
    assert_trees_close(got['params'], ref['params'], tolerances['params'],
                       what=f'{where} params')
    assert_trees_close(got['model_state'], ref['model_state'], tolerances['model_state'],
                       what=f'{where} model_state')
    assert int(got['step']) == int(ref['step']), f'{where}: state.step {got["step"]}'


# Compiled functions are cached per (task, mesh, rules, batch shapes): a property
# test drawing the same mesh twice compiles once.
@functools.lru_cache(maxsize=64)
def _single_jits(task: Task):
  return (jax.jit(task.init), jax.jit(task.step),
          jax.jit(lambda s, b: grads_of(task, s, b)))


@functools.lru_cache(maxsize=64)
def _plan(task: Task, mesh, rules: Rules, shapes):
  batch = {k: np.zeros(shape, dtype) for k, shape, dtype in shapes}
  plan = sharded(task, mesh, rules, batch)
  grads = jax.jit(lambda s, b: grads_of(task, s, b),
                  in_shardings=(plan.state_sharding, plan.batch_sharding))
  return plan, grads


def _shapes(batch) -> tuple:
  return tuple((k, tuple(np.shape(v)), np.asarray(v).dtype.name) for k, v in sorted(batch.items()))


def _single_device_run(task: Task, state: TrainState, batches, with_grads: bool):
  _, step, grads = _single_jits(task)
  out = []
  for batch in batches:
    g = grads(state, batch) if with_grads else None
    state, metrics = step(state, batch)
    out.append(_record(state, metrics, g))
  return out


def assert_step_matches_single_device(task: Task, mesh: jax.sharding.Mesh, rules: Rules,
                                      batches: Sequence[Mapping[str, Any]], *,
                                      key: jax.Array | None = None,
                                      tolerances: Mapping[str, Tolerance] | None = None):
  """``k = len(batches)`` steps on ``mesh`` under ``rules`` equal ``k`` single-device steps.

  After every step: the loss (summed over the global batch), the gradients
  (``grads_of``, computed with the plan's shardings), the parameters and the
  model state (BatchNorm statistics) are compared within ``tolerances``
  (default :data:`TOLERANCES`). Both runs start from ``task.init(key, batch)``,
  the sharded one created directly in its sharding.

  Raises:
    AssertionError: naming the step, the quantity and the leaf that differ.
  """
  tolerances = {**TOLERANCES, **(tolerances or {})}
  key = jax.random.key(0) if key is None else key
  ref = _single_device_run(task, _single_jits(task)[0](key, batches[0]), batches, True)
  plan, grads = _plan(task, mesh, rules, _shapes(batches[0]))
  state = plan.init(key)
  got = []
  for batch in batches:
    batch = plan.shard_batch(batch)
    g = grads(state, batch)
    state, metrics = plan.step(state, batch)
    got.append(_record(state, metrics, g))
  _compare_runs(ref, got, tolerances)


def assert_pmap_matches_jit(task: Task, batches: Sequence[Mapping[str, Any]], *,
                            num_devices: int | None = None, key: jax.Array | None = None,
                            tolerances: Mapping[str, Tolerance] | None = None):
  """``k`` steps of :func:`purax.parallel.pmap_step` equal ``k`` single-device jitted steps.

  The task must be deterministic (no dropout): pmap draws a distinct dropout
  key per device by design.

  Raises:
    AssertionError: naming the step, the quantity and the leaf that differ.
  """
  tolerances = {**TOLERANCES, **(tolerances or {})}
  key = jax.random.key(0) if key is None else key
  n = num_devices or jax.local_device_count()
  state = _single_jits(task)[0](key, batches[0])
  ref = _single_device_run(task, _copy(state), batches, False)
  step = spmd.pmap_step(task, devices=jax.local_devices()[:n])
  pstate = spmd.replicate(state, n)
  got = []
  for batch in batches:
    pstate, metrics = step(pstate, spmd.split_batch(batch, n))
    got.append(_record(spmd.unreplicate(pstate), spmd.unreplicate(metrics), None))
  _compare_runs(ref, got, tolerances)


def assert_same_training(step_a: Callable, state_a: TrainState, step_b: Callable,
                         state_b: TrainState, batches: Sequence[Mapping[str, Any]], *,
                         tolerances: Mapping[str, Tolerance] | None = None):
  """Two step functions (each with its own placement) train alike over ``batches``.

  ``step_x(state, batch) -> (state, metrics)``; loss, params and model state
  are compared after every step.
  """
  tolerances = {**TOLERANCES, **(tolerances or {})}
  ra, rb = [], []
  for batch in batches:
    state_a, ma = step_a(state_a, batch)
    state_b, mb = step_b(state_b, batch)
    ra.append(_record(state_a, ma, None))
    rb.append(_record(state_b, mb, None))
  _compare_runs(ra, rb, tolerances)
