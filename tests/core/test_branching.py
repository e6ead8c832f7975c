"""purax.fork: member i of a fork is the parent resumed alone with hyperparameters i."""

import jax
import numpy as np
import pytest

import purax
from purax.core import population as P
from purax.core.errors import ConfigError
from tests import helpers_population as tp
from tests.helpers import assert_bitwise

LRS, WDS = (3e-3, 1e-2, 3e-4), (1e-4, 0.0, 5e-2)


def parent(steps=3):
  """A run of ``steps`` updates: the state a fork branches from."""
  state = tp.sinit(jax.random.key(7), {}, tp.batch())
  for s in range(steps):
    state, _ = tp.sstep(state, tp.batch(s))
  return state


def test_member_i_equals_the_parent_resumed_alone_with_hyperparameters_i_bitwise():
  start = parent()
  pop = purax.fork(start, {'learning_rate': np.float32(LRS),
                           'weight_decay': np.float32(WDS)})
  assert int(pop.state.step[0]) == 3 and pop.num_members == 3
  for s in range(3, 6):
    pop, _ = tp.pstep(tp.TASK, pop, tp.batch(s))
  for i, (lr, wd) in enumerate(zip(LRS, WDS)):
    alone = purax.set_hyperparams(start, learning_rate=lr, weight_decay=wd)
    for s in range(3, 6):
      alone, _ = tp.sstep(alone, tp.batch(s))
    assert_bitwise(P.member(pop, i), alone, f'member {i}')
  # the members differ: the values took effect
  assert not np.array_equal(P.member(pop, 0).params['Dense_0']['kernel'],
                            P.member(pop, 2).params['Dense_0']['kernel'])


def test_a_name_left_out_keeps_the_parents_value_in_every_member():
  start = parent(1)
  pop = purax.fork(start, {'learning_rate': np.float32([1e-3, 2e-3])})
  got = purax.hyperparams(pop.state)
  np.testing.assert_array_equal(got['weight_decay'],
                                np.full(2, purax.hyperparams(start)['weight_decay']))
  np.testing.assert_array_equal(got['learning_rate'], np.float32([1e-3, 2e-3]))
  assert purax.fork(start, {}, members=4).num_members == 4


@pytest.mark.parametrize('state, hparams, kw, match', [
    ('stacked', {'learning_rate': [1e-3]}, {}, r'state: expected one run\'s state'),
    ('single', {'momentum': [0.9, 0.8]}, {}, r"hyperparameter name: expected one the state "
     r"carries.*cannot vary another.*got 'momentum'"),
    ('single', {'learning_rate': [1e-3, 2e-3], 'weight_decay': [0.0]}, {},
     r'members: expected .*one length of every value'),
    ('single', {'learning_rate': 1e-3}, {}, r'hparams: expected one value per member'),
    ('single', {}, {}, r'members: expected given'),
    ('single', {'learning_rate': [1e-3, -1.0]}, {}, r'learning_rate\[1\]'),
])
def test_bad_input_is_named(state, hparams, kw, match):
  start = parent(1)
  if state == 'stacked':
    start = P.stack([start, start])
  with pytest.raises(ConfigError, match=match):
    purax.fork(start, hparams, **kw)


# -- a cooldown fork: the WSD schedule's decay_start / cooldown_steps per member ----------

WSD_TASK = purax.Task(model=tp.TASK.model,
                      tx=purax.adamw(learning_rate=1e-2, total_steps=10, warmup_steps=2,
                                     schedule='wsd', decay_start=100.0, cooldown_steps=1.0))
wsd_sstep = jax.jit(WSD_TASK.step)
COOLDOWNS = (1.0, 2.0, 4.0)


def test_member_i_of_a_cooldown_fork_equals_the_parent_resumed_with_cooldown_i_bitwise():
  """Issue 48.1: branch cooldowns of 3 lengths from step 3 of a WSD run (its
  stable phase); member i equals the parent resumed alone with cooldown i,
  bitwise, and the cooldowns took effect (rates and params differ)."""
  start = WSD_TASK.init(jax.random.key(7), tp.batch())
  for s in range(3):
    start, _ = wsd_sstep(start, tp.batch(s))
  branch = float(start.step)
  pop = purax.fork(start, {'decay_start': np.float32([branch] * 3),
                           'cooldown_steps': np.float32(COOLDOWNS)})
  for s in range(3, 7):
    pop, _ = tp.pstep(WSD_TASK, pop, tp.batch(s))
  rates = []
  for i, cooldown in enumerate(COOLDOWNS):
    alone = purax.set_hyperparams(start, decay_start=branch, cooldown_steps=cooldown)
    for s in range(3, 7):
      alone, _ = wsd_sstep(alone, tp.batch(s))
    assert_bitwise(P.member(pop, i), alone, f'member {i}')
    rates.append(float(WSD_TASK.tx.learning_rate(alone.opt_state, applied=True)))
  # after 4 cooldown steps: lengths 1 and 2 ended (0), length 4 at its last step
  assert rates[:2] == [0.0, 0.0] and rates[2] == pytest.approx(1e-2 * (1 - np.sqrt(3 / 4)))
  assert not np.array_equal(P.member(pop, 0).params['Dense_0']['kernel'],
                            P.member(pop, 2).params['Dense_0']['kernel'])


def test_a_cooldown_fork_of_a_state_without_the_schedule_is_refused_by_name():
  with pytest.raises(ConfigError, match=r"hyperparameter name: expected one the state carries"
                                        r".*got 'cooldown_steps'"):
    purax.fork(parent(1), {'cooldown_steps': [10.0, 20.0]})
