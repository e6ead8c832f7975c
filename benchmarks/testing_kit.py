"""The testing kit against the same equivalence check written by hand.

A researcher's property: an NNX model's training step on meshes of 1, 2, 4
and 8 devices, data parallel and FSDP (8 cases), two steps each on one
example's batches, equals the single-device step. Both sides check the same
things after each step: the loss, the gradients the step applies, the params
and the optimizer state, within :data:`purax.testing.TOLERANCES`.

- ``purax``: :func:`purax.testing.assert_step_matches_single_device` per case
  (the whole state is compared: rng and step too).
- ``hand``: what one writes with ``jax.jit`` + ``NamedSharding``: the model
  split with ``nnx.split``, an optax Adam, a step returning ``(params,
  opt_state, loss, grads)`` jitted once on one device and once per mesh with
  ``in_shardings`` / ``out_shardings`` (FSDP: arrays of at least
  ``MIN_SIZE`` elements split on their largest dimension the axis divides,
  as :func:`purax.parallel.fsdp` does), ``np.testing.assert_allclose`` leaf
  by leaf.
- ``hand_fast``: the same, its programs compiled with the XLA options
  purax.testing compiles its own with on a CPU
  (:data:`purax.testing.asserts.CPU_COMPILER_OPTIONS`: LLVM at -O0, no
  fusion emitters), so the ratio to it shows what purax costs beyond the
  options.

Each trial of each side is a fresh process (as a test session is: nothing
compiled before), 8 host devices; the figure is the time of the 8 cases
(imports, device set-up and data excluded), median over ``--trials``;
trials are interleaved. Nothing is asserted; JSON out (``--out``).

Usage: ``python benchmarks/testing_kit.py [--trials 3] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from jsonout import write_json  # noqa: E402  (beside this script)

SIDES = ('purax', 'hand', 'hand_fast')
MESHES = (1, 2, 4, 8)
MIN_SIZE = 256        # FSDP splits the kernels (16 x 64, 64 x 10 has 640 elements)
LEARNING_RATE = 1e-2


def _cases():
  return [(n, kind) for n in MESHES for kind in ('dp', 'fsdp')]


def _data():
  import numpy as np
  rng = np.random.default_rng(0)
  return [{'x': rng.normal(size=(16, 16)).astype(np.float32),
           'y': rng.integers(0, 10, 16).astype(np.int32)} for _ in range(2)]


def _net():
  import jax
  from flax import nnx

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.a = nnx.Linear(16, 64, rngs=rngs)
      self.b = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x):
      return self.b(jax.nn.relu(self.a(x)))

  return Net


def run_purax(batches) -> float:
  import jax
  import optax

  import purax
  from purax import parallel, testing
  task = purax.Task(model=purax.NNX.from_constructor(_net()), tx=optax.adam(LEARNING_RATE))
  start = time.perf_counter()
  with jax.default_matmul_precision('highest'):
    for n, kind in _cases():
      if kind == 'dp':
        mesh, rules = testing.mesh_of({'data': n}), parallel.data_parallel()
      else:
        mesh, rules = testing.mesh_of({'data': 1, 'fsdp': n}), parallel.fsdp(MIN_SIZE)
      testing.assert_step_matches_single_device(task, mesh, rules, batches,
                                                learning_rate='auto')
  return time.perf_counter() - start


def run_hand(batches, compiler_options=None) -> float:
  import jax
  import numpy as np
  import optax
  from flax import nnx
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  from purax.testing import TOLERANCES

  tx = optax.adam(LEARNING_RATE)

  def init(key):
    graphdef, params = nnx.split(_net()(nnx.Rngs(key)))
    return graphdef, params, tx.init(params)

  def loss_fn(params, graphdef, batch):
    logits = nnx.merge(graphdef, params)(batch['x'])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch['y']).mean()

  def make_step(graphdef):
    def step(params, opt_state, batch):
      loss, grads = jax.value_and_grad(loss_fn)(params, graphdef, batch)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss, grads
    return step

  def fsdp_spec(x, n):
    if n == 1 or x.size < MIN_SIZE:
      return P()
    dims = sorted(range(x.ndim), key=lambda d: -x.shape[d])
    for d in dims:
      if x.shape[d] % n == 0:
        return P(*[('fsdp' if i == d else None) for i in range(x.ndim)])
    return P()

  def close(actual, expected, tol, what):
    for (path, a), e in zip(jax.tree_util.tree_flatten_with_path(actual)[0],
                            jax.tree.leaves(expected)):
      np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(e, np.float64),
                                 rtol=tol.rtol, atol=tol.atol,
                                 err_msg=f'{what}{jax.tree_util.keystr(path)}')

  start = time.perf_counter()
  with jax.default_matmul_precision('highest'):
    graphdef, params0, opt0 = init(jax.random.key(0))
    single = jax.jit(make_step(graphdef), compiler_options=compiler_options)
    for n, kind in _cases():
      devices = np.array(jax.devices()[:n])
      mesh = Mesh(devices.reshape(n), ('data',) if kind == 'dp' else ('fsdp',))
      axis = mesh.axis_names[0]
      spec = (lambda x: P()) if kind == 'dp' else (lambda x: fsdp_spec(x, n))
      p_sh = jax.tree.map(lambda x: NamedSharding(mesh, spec(x)), params0)
      o_sh = jax.tree.map(lambda x: NamedSharding(mesh, spec(x)), opt0)
      b_sh = NamedSharding(mesh, P(axis))
      repl = NamedSharding(mesh, P())
      sharded = jax.jit(make_step(graphdef), in_shardings=(p_sh, o_sh, b_sh),
                        out_shardings=(p_sh, o_sh, repl, p_sh), compiler_options=compiler_options)
      ref = (params0, opt0)
      got = (jax.device_put(params0, p_sh), jax.device_put(opt0, o_sh))
      for i, batch in enumerate(batches):
        rp, ro, rl, rg = single(*ref, batch)
        gp, go, gl, gg = sharded(*got, jax.device_put(batch, b_sh))
        ref, got = (rp, ro), (gp, go)
        host = jax.device_get((rp, ro, rl, rg, gp, go, gl, gg))
        rp, ro, rl, rg, gp, go, gl, gg = host
        where = f'mesh {n} {kind} step {i + 1} '
        close(gl, rl, TOLERANCES['loss'], where + 'loss')
        close(gg, rg, TOLERANCES['grads'], where + 'grads')
        widen = TOLERANCES['params'].atol + 2 * LEARNING_RATE * (i + 1)
        close(gp, rp, type(TOLERANCES['params'])(TOLERANCES['params'].rtol, widen),
              where + 'params')
        close(go, ro, TOLERANCES['opt_state'], where + 'opt_state')
  return time.perf_counter() - start


def child(side: str) -> None:
  batches = _data()
  import jax
  jax.devices()
  if side == 'hand_fast':
    from purax.testing.asserts import CPU_COMPILER_OPTIONS
    seconds = run_hand(batches, CPU_COMPILER_OPTIONS)
  else:
    seconds = (run_purax if side == 'purax' else run_hand)(batches)
  print(json.dumps({'side': side, 'seconds': seconds}))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--trials', type=int, default=3)
  parser.add_argument('--out', default=None)
  parser.add_argument('--child', choices=SIDES, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    return child(args.child)
  env = {**os.environ, 'XLA_FLAGS': (os.environ.get('XLA_FLAGS', '') +
                                     ' --xla_force_host_platform_device_count=8').strip(),
         'JAX_PLATFORMS': 'cpu'}
  times: dict[str, list[float]] = {side: [] for side in SIDES}
  for trial in range(args.trials):
    for side in SIDES:
      out = subprocess.run([sys.executable, __file__, '--child', side], env=env, check=True,
                           capture_output=True, text=True).stdout
      times[side].append(json.loads(out.strip().splitlines()[-1])['seconds'])
      print(f'trial {trial + 1} {side}: {times[side][-1]:.2f} s', flush=True)
  median = {side: statistics.median(t) for side, t in times.items()}
  import jax
  result = {'benchmark': 'testing_kit', 'cases': len(_cases()), 'steps': 2,
            'trials': args.trials, 'seconds': times, 'median_s': median,
            'ratio_purax_over_hand': median['purax'] / median['hand'],
            'ratio_purax_over_hand_fast': median['purax'] / median['hand_fast'],
            'jax': jax.__version__, 'python': platform.python_version(),
            'cpu_count': os.cpu_count(), 'xla_flags': env['XLA_FLAGS']}
  print(json.dumps(result, indent=1))
  if args.out:
    write_json(args.out, result, indent=1)


if __name__ == '__main__':
  main()
