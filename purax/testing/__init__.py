"""Assertions and hypothesis strategies that prove a parallel step is the single-device step.

:mod:`purax.testing.asserts` needs chex only; :mod:`purax.testing.hypotheses`
needs hypothesis and is here when it is installed, so ``import purax.testing``
works without it.

Example: your task's FSDP step on a 4 x 2 mesh trains as the single-device
step does (as a hypothesis property over meshes and batch sizes: the guide
"Testing your parallel step"):

  >>> from purax import testing
  >>> my_task = purax.Task(model=purax.nn.MLP(features=(16,), num_classes=10),
  ...                      tx=optax.sgd(0.1))
  >>> mesh = testing.mesh_of({'data': 4, 'fsdp': 2})
  >>> with jax.default_matmul_precision('highest'):
  ...   testing.assert_step_matches_single_device(my_task, mesh, parallel.fsdp(), batches[:2])

Tolerances (:data:`TOLERANCES`) assume float32 at ``highest`` matmul
precision on CPU. A sharded step differs from the single-device one only in
the order of its floating-point sums (a partial sum per device, then an
all-reduce): relative error ``~ batch * 2**-24``, a few ``1e-6`` for the
batches here. Adam divides by ``sqrt(nu)``, which can amplify the difference
of a gradient entry near 0 to a fraction of the learning rate, so parameters
after ``k`` steps get an absolute tolerance of ``1e-5`` (for learning rates
<= 1e-2 and a few steps). Where a gradient entry is *structurally* zero (an
unused class's bias, a masked embedding row) its value on either path is
pure rounding noise of either sign, and Adam's first step is ``-lr *
sign(g)``: pass ``learning_rate=`` (or ``'auto'``) to widen the params
tolerance by ``2 * lr`` per step taken; the gradients themselves are still
compared at their own tight tolerance, so an error in the gradient (e.g. an
all-reduce off by the device count) is not hidden by the widening. Nothing is
compared bitwise across meshes.

The assertions take any state pytree (a purax ``TrainState``, a flax
``TrainState``, a dict) and compare every leaf kind: floats (bfloat16 in
float64), integers and booleans exactly, typed PRNG keys by implementation
and key data, ``None`` as structure; a difference names its path. They are
chex assertions (``chex.assert_trees_all_close``, ``assert_trees_all_equal``,
``assert_trees_all_equal_shapes_and_dtypes``, ``assert_tree_all_finite``)
applied leaf by leaf, extended where chex falls short: typed keys, which chex
cannot read; floats (bfloat16 too) compared in float64; the path
of the leaf within the state and the step it differs at. The reference run of
every comparison must stay finite (:func:`assert_finite`): NaN equals NaN in
the comparisons, so two diverged runs would otherwise match.

Strategies touch devices only when drawn, never at import.
"""

from purax.testing.asserts import TOLERANCES as TOLERANCES
from purax.testing.asserts import Tolerance as Tolerance
from purax.testing.asserts import assert_finite as assert_finite
from purax.testing.asserts import assert_pmap_matches_jit as assert_pmap_matches_jit
from purax.testing.asserts import assert_same_training as assert_same_training
from purax.testing.asserts import (assert_step_matches_single_device as
                                   assert_step_matches_single_device)
from purax.testing.asserts import assert_trees_close as assert_trees_close
from purax.testing.asserts import grads_of as grads_of
from purax.testing.asserts import learning_rate_of as learning_rate_of

#: The hypothesis strategies (:mod:`purax.testing.hypotheses`): here when
#: hypothesis (the ``testing`` extra) is installed.
STRATEGIES = ('mesh_shapes', 'mesh_of', 'meshes', 'batch_sizes', 'classification_batches',
              'small_pytrees')

try:
  import hypothesis   # noqa: F401  (the strategies' one optional dependency)
except ImportError:
  hypothesis = None
else:
  from purax.testing.hypotheses import batch_sizes as batch_sizes
  from purax.testing.hypotheses import classification_batches as classification_batches
  from purax.testing.hypotheses import mesh_of as mesh_of
  from purax.testing.hypotheses import mesh_shapes as mesh_shapes
  from purax.testing.hypotheses import meshes as meshes
  from purax.testing.hypotheses import small_pytrees as small_pytrees

from purax.core import lazy as _lazy  # noqa: E402

# Renamed in 0.3 (no two modules of one file name): the old import path still works.
_lazy.moved('purax.testing.strategies', 'purax.testing.hypotheses')

__all__ = [
    'TOLERANCES', 'Tolerance', 'assert_trees_close', 'assert_finite', 'grads_of',
    'learning_rate_of', 'assert_step_matches_single_device', 'assert_pmap_matches_jit',
    'assert_same_training', *STRATEGIES,
]


def __getattr__(name):
  if name in STRATEGIES:
    raise ImportError(f'purax.testing.{name}: expected hypothesis to be installed '
                      "(pip install 'purax[testing]'), got none")
  raise AttributeError(f'module purax.testing has no attribute {name!r}')
