"""What importing purax needs: the core, the models, purax.testing's assertions
and benchmarks/lm.py run with jax, flax, optax, orbax, chex and numpy alone
(the GPU machine's image lacks grain, tyro and tensorboardX; scikit-learn and
mnist1d are blocked too, since nothing here should need a data set, and
hypothesis, which only purax.testing's strategies need)."""

import os
import subprocess
import sys

OPTIONAL = ('grain', 'tyro', 'tensorboardX', 'sklearn', 'mnist1d', 'hypothesis')

SCRIPT = f"""
import sys
for name in {OPTIONAL!r}:
  sys.modules[name] = None          # importing it now raises ImportError
import jax, jax.numpy as jnp
import purax
from purax.nn.transformer import DecoderLM
task = purax.Task(model=DecoderLM(d_model=32, num_layers=1, num_heads=2, max_len=8),
                  tx=purax.adamw(learning_rate=1e-3, total_steps=2),
                  loss=purax.objectives.language_model)
batch = {{'x': jnp.zeros((2, 8), jnp.int32), 'y': jnp.zeros((2, 8), jnp.int32)}}
state = jax.eval_shape(task.init, jax.random.key(0), batch)   # traced, not compiled
state, metrics = jax.eval_shape(task.step, state, batch)
assert state.step.shape == () and 'bits_per_byte' in metrics
import purax.testing                # the assertions need chex only
purax.testing.assert_trees_close({{'w': jnp.ones(2)}}, {{'w': jnp.ones(2)}},
                                 purax.testing.TOLERANCES['params'])
try:
  purax.testing.mesh_shapes        # the strategies need hypothesis
except ImportError:
  pass
else:
  raise AssertionError('purax.testing.mesh_shapes without hypothesis')
import runpy
sys.path.insert(0, 'benchmarks')   # as `python benchmarks/lm.py` puts its folder first
sys.argv = ['lm.py', '--help']
try:
  runpy.run_path('benchmarks/lm.py', run_name='__main__')
except SystemExit as e:
  assert e.code == 0, e.code
print('ok')
"""


def test_core_models_and_lm_benchmark_need_no_optional_packages():
  env = {k: v for k, v in os.environ.items() if not k.startswith('PURAX_')}
  env['PYTHONPATH'] = os.getcwd() + os.pathsep + env.get('PYTHONPATH', '')
  out = subprocess.run([sys.executable, '-c', SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().endswith('ok')
