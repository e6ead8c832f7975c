"""Writes tests/fixtures/guards_before_0.3.0.npz: the digests of the guards'
training matrix (tests/helpers_guards.py: names, uint64 digests) on the code this runs with, under the suite's XLA
flags. Run from the repository root: python -m tests.scripts.guard_references
[OUT.npz]. It was run once on the code before the guards were composed."""

import os
import sys

# The suite's flags (tests/conftest.py), set before jax is imported.
os.environ['XLA_FLAGS'] = ('--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false'
                           ' --xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update('jax_numpy_rank_promotion', 'raise')

from tests import helpers_guards  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'fixtures',
    'guards_before_0.3.0.npz')
digests = helpers_guards.digests(helpers_guards.matrix())
np.savez_compressed(out, names=np.array(sorted(digests)),
                    digests=np.array([digests[k] for k in sorted(digests)], np.uint64))
print(out, len(digests), 'digests')
