"""The guards' training matrix: a tiny MLP trained a few steps on every plan
with each combination of guards, its end state and logged metrics as flat
numpy arrays.

``tests/fixtures/guards_before_0.3.0.npz`` holds what this gave on the code
before the guards were composed (``update.step`` of 0.2, guard state in
``TrainState.loss_scale`` / ``spike_window``), written by
``python -m tests.scripts.guard_references`` under the suite's XLA flags
(``tests/core/test_guards.py`` compares today's code with it, bitwise). It
uses only the public API of both versions (``purax.fit`` with a plan, the
plans' constructors).
"""

import hashlib
import itertools

import jax
import jax.numpy as jnp
import numpy as np

import purax
from purax import parallel
from purax.core import population as P
from purax.io import writers

CLASSES, FEATURES, BATCH, STEPS = 3, 6, 8, 8
NAN_STEP, SPIKE_STEP = 3, 5          # the batch made non-finite, the one scaled up
#: The guards a combination turns on: ``nonfinite`` (``skip_nonfinite``),
#: ``spike`` (a :class:`purax.SpikeGuard`), ``scale`` (dynamic loss scaling).
GUARDS = ('nonfinite', 'spike', 'scale')
COMBOS = tuple(itertools.product((False, True), repeat=len(GUARDS)))
PLANS = ('single', 'k2', 'mesh', 'population', 'population_mesh')
#: The combinations a test runs on a plan (the fixture has all of them on every
#: plan): a population's programs compile slowly, so it runs four, each guard
#: on in two and off in two (its member 0 frozen by its NaN in the two
#: without loss scaling, where that NaN is a divergence).
TESTED = {plan: COMBOS if not plan.startswith('population') else
          ((False, False, False), (True, True, False), (False, False, True), (True, True, True))
          for plan in PLANS}


def name(plan, combo):
  on = [g for g, b in zip(GUARDS, combo) if b]
  return f"{plan}/{'+'.join(on) or 'none'}"


def task(combo):
  nonfinite, spike, scale = combo
  return purax.Task(model=purax.nn.MLP(num_classes=CLASSES, features=(16,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=STEPS, warmup_steps=0),
                    skip_nonfinite=nonfinite,
                    spike_guard=purax.SpikeGuard(window=4, k=3.0) if spike else None,
                    loss_scale=2.0 ** 15 if scale else None)


def batches(stream=0):
  """``STEPS`` batches; stream 0 has a NaN at ``NAN_STEP`` (every stream a
  scaled-up batch at ``SPIKE_STEP``)."""
  rng = np.random.default_rng(stream)
  out = []
  for s in range(STEPS):
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    if s == SPIKE_STEP:
      x = x * 30
    if s == NAN_STEP and stream == 0:
      x[1, 2] = np.nan
    out.append({'x': x, 'y': rng.integers(0, CLASSES, size=(BATCH,)).astype(np.int32)})
  return out


def _log(every=1):
  return [purax.hooks.Log(every=every, writer=writers.MultiWriter([]))]


def _guard_state(state):
  """The guards' state, wherever the version keeps it."""
  guards = getattr(state, 'guards', None)
  if guards is not None:
    return {'loss_scale': guards.get('loss_scale'), 'spike_window': guards.get('spikes')}
  return {'loss_scale': state.__dict__.get('loss_scale'),
          'spike_window': state.__dict__.get('spike_window')}


def _flat(state, history):
  """``{path: array}`` of the end state (params, opt_state, model_state, step,
  guard state) and of every logged metric."""
  if isinstance(state, P.Population):
    out = {'pop.frozen': np.asarray(state.frozen)}
    state = state.state
  else:
    out = {}
  tree = {'step': state.step, 'params': state.params, 'opt_state': state.opt_state,
          'model_state': state.model_state, 'guards': _guard_state(state)}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    out[jax.tree_util.keystr(path)] = np.asarray(leaf)
  for i, record in enumerate(history):
    for key, value in sorted(record.items()):
      if key.startswith('train/'):
        out[f'log{i}.{key}'] = np.asarray(value, np.float64)
  return out


def run(plan, combo):
  """The flat end state and metrics of ``STEPS`` steps of ``plan`` with ``combo``."""
  t = task(combo)
  key = jax.random.key(0)
  if plan.startswith('population'):
    data = batches(0), batches(1)
    stacked = [{k: np.stack([data[0][s][k], data[1][s][k]]) for k in data[0][s]}
               for s in range(STEPS)]
    # Member 0 reads stream 0 (its NaN freezes it: the frozen path), member 1 stream 1.
    pop = P.init(t, jax.vmap(jax.random.key)(jnp.arange(2)),
                 {'weight_decay': jnp.asarray([1e-4, 1e-1], jnp.float32)}, data[0][0])
    mesh = parallel.make_mesh(data=4, fsdp=1, devices=jax.devices()[:4]) if plan.endswith(
        'mesh') else None
    p = purax.plan.PopulationPlan(t, batch_index=jnp.arange(2, dtype=jnp.int32), mesh=mesh)
    state, history = purax.fit(t, pop, stacked, steps=STEPS, plan=p, hooks=_log(),
                               steps_per_call=1)
    return _flat(state, history)
  data = batches(0)
  state = t.init(key, data[0])
  if plan == 'mesh':
    mesh = parallel.make_mesh(data=4, fsdp=2)
    p = parallel.sharded(t, mesh, parallel.fsdp(min_size=16), data[0])
    state, history = purax.fit(t, state, data, steps=STEPS, plan=p, hooks=_log(),
                               steps_per_call=1)
  else:
    k = 2 if plan == 'k2' else 1
    state, history = purax.fit(t, state, data, steps=STEPS, hooks=_log(k), steps_per_call=k)
  return _flat(state, history)


def matrix(plans=PLANS, combos=COMBOS):
  """``{name(plan, combo) + ':' + path: array}`` over the plans and combinations."""
  out = {}
  for plan in plans:
    for combo in combos:
      with jax.default_matmul_precision('highest'):
        for path, value in run(plan, combo).items():
          out[f'{name(plan, combo)}:{path}'] = value
  return out


def digest(a) -> np.uint64:
  """The first 8 bytes of the SHA-256 of an array's dtype, shape and bytes."""
  a = np.ascontiguousarray(a)
  h = hashlib.sha256(f'{a.dtype.str}{a.shape}'.encode() + a.tobytes()).digest()
  return np.frombuffer(h[:8], np.uint64)[0]


def digests(arrays) -> dict:
  """``{name: digest}`` of :func:`matrix`'s arrays."""
  return {k: digest(v) for k, v in arrays.items()}
