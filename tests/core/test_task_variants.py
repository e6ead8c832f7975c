"""The pure functions of :class:`purax.Task` under chex variants: ``init``,
``step``, ``evaluate`` and ``predict`` give the same result eagerly, under
``jax.jit`` and under ``jax.pmap`` (each device computing the same thing, the
first device's output compared), and ``step`` traces once for a run.

Tolerances: every variant is compared with one jitted reference at
``highest`` matmul precision; jit and eager differ only in the order XLA's
fusion sums float32 values (relative ``~1e-6`` over these tiny reductions),
so floats compare at ``rtol=1e-5, atol=1e-6`` (params after 3 Adam steps at
``atol=1e-5``: Adam's ``1/sqrt(nu)`` can amplify a near-zero gradient's
rounding), integers, keys and booleans exactly.
"""

import chex
import jax
import numpy as np

from purax import testing
from purax.core import metrics
from tests.helpers import tiny_batch, tiny_task

TIGHT = testing.Tolerance(rtol=1e-5, atol=1e-6)
ADAM = testing.Tolerance(rtol=1e-5, atol=1e-5)
PMAP_DEVICES = 2      # each device runs the whole step: 2 show the path, 8 cost 4x


def _variant(test, fn, **jit_kwargs):
  """``test.variant(fn)``, with the pmap variant on ``PMAP_DEVICES`` devices."""
  if test.variant.type == chex.ChexVariantType.WITH_PMAP:   # pylint: disable=no-member
    return test.variant(fn, n_devices=PMAP_DEVICES)
  return test.variant(fn, **jit_kwargs)


# Dropout on: the step's key (fold_in(rng, step)) must be the same on every path.
TASK = tiny_task('mlp', dropout_rate=0.5)
# The jitted references, built once for the module (one compilation each).
REF_INIT, REF_STEP = jax.jit(TASK.init), jax.jit(TASK.step)
REF_EVALUATE, REF_PREDICT = jax.jit(TASK.evaluate), jax.jit(TASK.predict)


class TaskVariantsTest(chex.TestCase):
  """Each test runs once per variant (eager, jit, pmap)."""

  def setUp(self):
    super().setUp()
    self.task, self.batch, self.key = TASK, tiny_batch(), jax.random.key(0)
    with jax.default_matmul_precision('highest'):
      self.state = REF_INIT(self.key, self.batch)

  @chex.variants(with_jit=True, without_jit=True, with_pmap=True)
  def test_init(self):
    with jax.default_matmul_precision('highest'):
      got = _variant(self, self.task.init)(self.key, self.batch)
    testing.assert_trees_close(got, self.state, TIGHT, what='init state')
    chex.assert_trees_all_equal_shapes_and_dtypes(got.params, self.state.params)

  @chex.variants(with_jit=True, without_jit=True, with_pmap=True)
  def test_three_steps_equal_the_jitted_reference(self):
    step = _variant(self, self.task.step)
    reference = REF_STEP
    with jax.default_matmul_precision('highest'):
      testing.assert_same_training(
          reference, self.state, step, self.state, [self.batch] * 3,
          tolerances={'params': ADAM, 'opt_state': ADAM, 'loss': TIGHT})

  @chex.variants(with_jit=True, without_jit=True, with_pmap=True)
  def test_step_then_evaluate_equal_the_jitted_reference(self):
    """One step, then evaluate on a weighted batch: metrics (sums and
    counts) and the new state agree with the jitted functions'."""
    weighted = tiny_batch(seed=1, weight=True)
    with jax.default_matmul_precision('highest'):
      ref_state, ref_m = REF_STEP(self.state, self.batch)
      ref_eval = REF_EVALUATE(ref_state, weighted)
      state, m = _variant(self, self.task.step)(self.state, self.batch)
      got_eval = _variant(self, self.task.evaluate)(state, weighted)
    testing.assert_trees_close(state, ref_state, ADAM, what='state')
    testing.assert_trees_close(m, ref_m, TIGHT, what='step metrics')
    testing.assert_trees_close(got_eval, ref_eval, TIGHT, what='eval metrics')
    chex.assert_tree_all_finite(got_eval)
    assert metrics.compute(got_eval).keys() == metrics.compute(ref_eval).keys()

  @chex.variants(with_jit=True, without_jit=True, with_pmap=True)
  def test_predict(self):
    with jax.default_matmul_precision('highest'):
      ref = REF_PREDICT(self.state, self.batch['x'])
      got = _variant(self, self.task.predict)(self.state, self.batch['x'])
    chex.assert_shape(got, (8, 10))
    chex.assert_type(got, np.float32)
    chex.assert_trees_all_close(got, ref, rtol=TIGHT.rtol, atol=TIGHT.atol)


def test_step_traces_once_for_a_run_and_a_new_learning_rate():
  """One compilation per run: three steps and a state with another learning
  rate (an array in opt_state.hyperparams) reuse the first trace."""
  task = tiny_task()
  batch = tiny_batch()
  state = task.init(jax.random.key(0), batch)
  step = jax.jit(chex.assert_max_traces(task.step, n=1))
  for _ in range(3):
    state, _ = step(state, batch)
  hp = dict(state.opt_state.hyperparams, learning_rate=np.float32(3e-3))
  step(state.replace(opt_state=state.opt_state._replace(hyperparams=hp)), batch)
