"""Suite-wide JAX settings, set before jax is imported anywhere.

- 8 host CPU devices, for the parallel tests; XLA:CPU's backend at -O0 (below);
- one persistent compilation cache for the session (below), shared by the
  xdist workers and the child processes, removed at the end;
- rank promotion raises (catches silent broadcasting bugs); dtype promotion is
  strict (catches implicit up- and down-casts; as equinox's conftest does), in
  this process only: the child processes run jax's default;
- a deterministic hypothesis profile for CI (derandomized, no deadline,
  bounded examples); PURAX_HYPOTHESIS_PROFILE=dev explores more.
"""

import os

# XLA:CPU compiles fast unless PURAX_TEST_XLA_OPT=default: compiling is most
# of the suite's time. Its LLVM backend at -O0 takes a fifth off it (897 ->
# 729 s on 2 cores), and the elemental IR emitter in place of the MLIR fusion
# emitters compiles a small step 2-3.5x faster (a tiny CNN's train step: 1.6
# -> 0.45 CPU-s; its run is slower, which a test's few steps do not feel).
# HLO passes (fusion decisions, layout, buffer assignment, the scheduler) are
# untouched, so the counts the tests assert are XLA's defaults; each numerics
# claim compares programs compiled alike (child processes included).
FAST = ('' if os.environ.get('PURAX_TEST_XLA_OPT') == 'default'
        else ' --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false')
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + FAST +
                           ' --xla_force_host_platform_device_count=8').strip()
# The child processes (resume, hooks, distributed, examples) set their own
# device count and take the same -O level from here.
os.environ['PURAX_TEST_CHILD_XLA_FLAGS'] = FAST.strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# The same programs compile in both xdist workers and in every child process
# (each `purax train` of a resume test compiles the step its neighbour just
# did): one persistent cache for the session lets all but the first load it.
# The first process to import this (pytest's main process) makes the
# directory; workers and children inherit it through the environment. The
# cache key is the program, the devices and the XLA flags, so a hit is the
# same executable. PURAX_TEST_COMPILATION_CACHE=0 turns it off.
if os.environ.get('PURAX_TEST_COMPILATION_CACHE') != '0':
  if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
    import tempfile
    os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='purax-test-xla-cache-')
    os.environ['PURAX_TEST_CACHE_OWNER'] = str(os.getpid())
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, Phase, settings  # noqa: E402

jax.config.update('jax_numpy_rank_promotion', 'raise')
jax.config.update('jax_numpy_dtype_promotion', 'strict')

settings.register_profile(
    'ci', derandomize=True, deadline=None, max_examples=10, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile('dev', deadline=None, max_examples=50,
                          suppress_health_check=[HealthCheck.too_slow])
# tests.mutations: a failing example is enough, its shrinking is not needed.
settings.register_profile('mutation', parent=settings.get_profile('ci'),
                          phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.load_profile(os.environ.get('PURAX_HYPOTHESIS_PROFILE', 'ci'))


@pytest.fixture(autouse=True)
def dtype_promotion(request):
  """A test marked ``@pytest.mark.dtype_promotion('standard')`` runs under jax's
  standard promotion: one whose mixed precision reaches code that assumes it
  and that purax does not call (jax's ``dot_product_attention`` gradient,
  flax's ``TrainState`` and optax called directly by the test)."""
  marker = request.node.get_closest_marker('dtype_promotion')
  if marker is None:
    yield
    return
  with jax.numpy_dtype_promotion(*marker.args):
    yield


@pytest.fixture(scope='session')
def straight_run(tmp_path_factory):
  """The uninterrupted ``purax train`` run of ``tests.test_resume.ARGS``, its
  batches recorded (``batches.txt``): one process shared by the tests that
  compare against it (once per xdist worker that draws one); they only read
  it."""
  from tests.helpers_runs import ARGS, purax
  workdir = str(tmp_path_factory.mktemp('straight') / 'run')
  done = purax('train', *ARGS, '--workdir', workdir, recorded_stop=0)
  assert done.returncode == 0, done.stderr
  return workdir


def pytest_unconfigure(config):
  """The session's compilation cache goes with the process that made it."""
  if os.environ.get('PURAX_TEST_CACHE_OWNER') == str(os.getpid()):
    import shutil
    shutil.rmtree(os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)
