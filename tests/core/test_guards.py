"""The composed guards (purax/core/guards.py) train bitwise as the step of 0.2
did, on every plan, with each combination of guards on and off.

The coverage matrix (tests/helpers_guards.py): plans ``single`` (one device),
``k2`` (two steps per call), ``mesh`` (sharded on a 4x2 data/fsdp mesh),
``population`` and ``population_mesh`` (two members, one of them frozen by a
NaN batch when nothing else handles it: the ``frozen`` guard) x the 8
combinations of the non-finite guard, the spike guard and loss scaling (4 on
the population plans: ``helpers_guards.TESTED``), each
trained 8 steps through ``purax.fit`` over a NaN batch and a spike. The end
state (step, params, optimizer state, model state, guard state, a
population's frozen flags) and every logged metric are compared with the
digests that code wrote (tests/fixtures/guards_before_0.3.0.npz, written by
``python -m tests.scripts.guard_references`` on 248594e, the commit before this
change, under this suite's XLA flags)."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purax
from purax.core import guards as guards_lib
from purax.core import metrics as metrics_lib
from tests import helpers_guards as H

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'fixtures',
                       'guards_before_0.3.0.npz')


def reference() -> dict:
  with np.load(FIXTURE) as z:
    return dict(zip(z['names'].tolist(), z['digests'].tolist()))


@pytest.mark.parametrize('plan', H.PLANS)
def test_every_guard_combination_trains_bitwise_as_before(plan):
  names = tuple(H.name(plan, combo) + ':' for combo in H.TESTED[plan])
  # 0.3 calls the learning rate by one name (it was 'peak_learning_rate' in the state).
  before = {k.replace("['peak_learning_rate']", "['learning_rate']"): v
            for k, v in reference().items() if k.startswith(names)}
  now = {k: int(v) for k, v in H.digests(H.matrix((plan,), H.TESTED[plan])).items()}
  assert set(now) == set(before), sorted(set(now) ^ set(before))[:10]
  differ = sorted(k for k in now if now[k] != before[k])
  assert not differ, f'{len(differ)} of {len(now)} arrays differ from 0.2, e.g. {differ[:8]}'


def signals(finite=True, loss=1.0, grad_norm=1.0):
  return guards_lib.Signals(jnp.asarray(finite), jnp.asarray(loss, jnp.float32),
                            jnp.asarray(grad_norm, jnp.float32))


def test_no_guard_asked_for_is_none_run():
  assert guards_lib.of({}, skip_nonfinite=False) == {}
  assert list(guards_lib.of({}, skip_nonfinite=True)) == ['nonfinite']
  # Any other guard brings the non-finite one (the branch never applies a NaN update).
  assert list(guards_lib.of({'loss_scale': purax.core.loss_scale.LossScale.create()},
                            skip_nonfinite=False)) == ['nonfinite', 'loss_scale']


def test_combine_skips_when_any_guard_says_so_and_freezes_a_frozen_members_guards():
  scale = purax.core.loss_scale.LossScale.create(4.0)
  spike = purax.SpikeGuard(window=2, k=1.0)
  window = spike.init()
  state = {'loss_scale': scale, 'spikes': window, 'other': jnp.ones(())}
  checks = guards_lib.of(state, spike_guard=spike, frozen_flag=jnp.asarray(False))
  v = guards_lib.combine(checks, signals(finite=False, loss=np.nan), state, jnp.asarray(False))
  assert not v.ok and float(v.state['loss_scale'].scale) == 2.0      # halved
  assert int(v.state['spikes'].size) == 0                           # NaN never recorded
  assert v.state['other'] is state['other']                         # no guard's: kept
  assert float(v.metrics['skipped'].value) == 1.0
  v = guards_lib.combine(checks, signals(), state, jnp.asarray(False))
  assert v.ok and int(v.state['spikes'].size) == 1
  frozen = guards_lib.of(state, spike_guard=spike, frozen_flag=jnp.asarray(True))
  v = guards_lib.combine(frozen, signals(finite=False), state, jnp.asarray(True))
  assert not v.ok
  assert float(v.state['loss_scale'].scale) == 4.0 and int(v.state['spikes'].size) == 0
  assert all(not np.any(x) for x in jax.tree.leaves(v.metrics)), v.metrics
  assert metrics_lib.compute(v.metrics)['loss_scale'] != metrics_lib.compute(v.metrics)[
      'loss_scale']   # nothing counted: NaN


GUARDED = H.task((True, True, True))


def test_guard_state_is_one_subtree_that_the_step_carries_through():
  """A guard adds a key to state.guards, not a field; a key no guard owns rides along."""
  fields = [f.name for f in dataclasses.fields(purax.TrainState)]
  assert fields == ['step', 'params', 'model_state', 'opt_state', 'rng', 'hparams', 'guards']
  state = GUARDED.init(jax.random.key(0), H.batches()[0])
  assert sorted(state.guards) == ['loss_scale', 'spikes']
  assert H.task((True, False, False)).init(jax.random.key(0), H.batches()[0]).guards == {}
  mine = jnp.arange(3.0)
  after, _ = jax.jit(GUARDED.step)(state.replace(guards={**state.guards, 'mine': mine}),
                                   H.batches()[0])
  assert sorted(after.guards) == ['loss_scale', 'mine', 'spikes']
  np.testing.assert_array_equal(after.guards['mine'], mine)
  assert int(after.guards['spikes'].size) == 1


def test_the_spellings_before_0_3_work_with_a_deprecation_warning():
  state = GUARDED.init(jax.random.key(0), H.batches()[0])
  with pytest.warns(DeprecationWarning, match=r"state.guards.get\('loss_scale'\)"):
    assert state.loss_scale is state.guards['loss_scale']
  with pytest.warns(DeprecationWarning, match=r"state.guards.get\('spikes'\)"):
    assert state.spike_window is state.guards['spikes']
  with pytest.warns(DeprecationWarning, match=r"guards=\{'loss_scale': ...\}"):
    made = purax.TrainState(step=state.step, params=state.params, model_state={},
                            opt_state=state.opt_state, rng=state.rng, hparams=state.hparams,
                            loss_scale=state.guards['loss_scale'], spike_window=None)
  assert list(made.guards) == ['loss_scale']
  with pytest.warns(DeprecationWarning):
    dropped = state.replace(loss_scale=None)
  assert list(dropped.guards) == ['spikes'] and 'loss_scale' in state.guards
  with pytest.warns(DeprecationWarning):
    assert dropped.loss_scale is None
