import math
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import purax
from purax.core import hparams as hparams_lib
from purax.core import optim, precision


def test_warmup_cosine_accepts_a_traced_peak():
  fn = jax.jit(lambda peak, count: optim.warmup_cosine(peak, warmup_steps=10,
                                                       total_steps=110)(count))
  assert float(fn(2.0, 0)) == 0.0
  np.testing.assert_allclose(fn(2.0, 10), 2.0, rtol=1e-6)
  np.testing.assert_allclose(fn(2.0, 60), 1.0, rtol=1e-5)   # cosine midpoint
  np.testing.assert_allclose(fn(3.0, 110), 0.0, atol=1e-6)


@flax.struct.dataclass
class OptOnly:
  opt_state: Any
  hparams: dict


def test_hyperparameters_are_float32_and_settable():
  tx = purax.adamw(learning_rate=1e-3, total_steps=10)
  state = tx.init({'w': jnp.zeros(3, jnp.bfloat16)})
  assert {k: v.dtype for k, v in state.hyperparams.items()} == \
      dict.fromkeys(['b1', 'b2', 'clip_norm', 'eps', 'learning_rate', 'weight_decay'],
                    jnp.float32)
  holder = OptOnly(opt_state=state, hparams={})   # what the setter reads and replaces
  new = purax.set_hyperparams(holder, learning_rate=3e-4).opt_state
  np.testing.assert_allclose(new.hyperparams['learning_rate'], 3e-4)
  with pytest.raises(purax.ConfigError, match="hyperparameter name: expected one of"):
    purax.set_hyperparams(holder, lr=1.0)


def test_clipping_bounds_the_norm_and_zero_norm_gives_zero_updates():
  clip = optim.clip_by_global_norm(1.0)
  g = {'a': jnp.full((4,), 3.0, jnp.bfloat16), 'b': jnp.full((2,), 3.0)}
  out, _ = clip.update(g, clip.init(g))
  assert out['a'].dtype == jnp.bfloat16
  norm = optax_norm(out)
  np.testing.assert_allclose(norm, 1.0, rtol=1e-2)
  zero_clip = optim.clip_by_global_norm(jnp.float32(0.0))
  zeros = jax.tree.map(jnp.zeros_like, g)
  out, _ = zero_clip.update(zeros, zero_clip.init(zeros))
  assert all(bool(jnp.all(x == 0)) for x in jax.tree.leaves(out))


def optax_norm(tree):
  return float(jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32)))
                            for x in jax.tree.leaves(tree))))


@pytest.mark.parametrize('kwargs, field', [
    (dict(learning_rate=-1.0), 'learning_rate'), (dict(b2=1.0), 'b2'),
    (dict(clip_norm=-1.0), 'clip_norm'), (dict(total_steps=0), 'total_steps')])
def test_bad_optimizer_values_name_the_field(kwargs, field):
  kwargs = {'total_steps': 10, **kwargs}
  with pytest.raises(purax.ConfigError, match=f'^{field}: expected'):
    purax.adamw(**kwargs)


def test_the_setter_refuses_values_outside_the_bounds_table_and_sets_the_rate_by_its_name():
  task = purax.Task(model=purax.nn.MLP(num_classes=3, features=(4,)),
                    tx=purax.adamw(learning_rate=1e-3, total_steps=10))
  state = task.init(jax.random.key(0), {'x': np.zeros((2, 5), np.float32),
                                        'y': np.zeros((2,), np.int32)})
  with pytest.raises(purax.ConfigError, match=r'hyperparameter weight_decay: expected a finite '
                                              r'value in \[0, 1\], got -1.0'):
    purax.set_hyperparams(state, weight_decay=-1.0)
  with pytest.raises(purax.ConfigError, match=r'hyperparameter b2: expected a finite value in '
                                              r'\[0, 1\)'):
    purax.set_hyperparams(state, b2=1.0)
  # One name: the builder's argument is the state's (the schedule's peak) and
  # the rate the schedule gives follows it.
  lowered = purax.set_hyperparams(state, learning_rate=1e-4)
  assert float(purax.hyperparams(lowered)['learning_rate']) == pytest.approx(1e-4)
  now = lambda s: float(purax.hyperparams(s, task.tx)['learning_rate'])   # noqa: E731
  assert now(lowered) == pytest.approx(now(state) / 10)
  assert float(purax.set_hyperparams(state, weight_decay=0.5).opt_state.hyperparams[
      'weight_decay']) == 0.5


NON_FINITE = [float('nan'), float('inf'), -float('inf')]


@pytest.mark.parametrize('value', NON_FINITE)
@pytest.mark.parametrize('field', ['learning_rate', 'weight_decay', 'b1', 'b2', 'eps',
                                   'clip_norm', 'eps_root'])
def test_adamw_refuses_a_non_finite_value_by_name(field, value):
  """Issue 28.5: ``adamw(learning_rate=inf)`` was accepted (NaN was refused only
  by the range check)."""
  with pytest.raises(purax.ConfigError,
                     match=rf'^{field}: expected a finite (number|value in) .*, got {value}$'):
    purax.adamw(total_steps=10, **{field: value})


def test_adamw_refuses_eps_zero_without_eps_root_and_the_update_it_would_spoil_is_real():
  """With eps = eps_root = 0, a parameter whose gradient is 0 from the start
  gets 0 / 0 = NaN from finite gradients, loss and hyperparameters, where
  the guard cannot see it: refused by name."""
  with pytest.raises(purax.ConfigError, match=r'^eps: expected > 0 \(or eps_root > 0'):
    purax.adamw(total_steps=10, eps=0.0)
  tx = optax.adam(1e-3, eps=0.0)                    # the update the refusal prevents
  params = {'w': jnp.ones(2)}
  grads = {'w': jnp.array([0.0, 1.0])}
  updates, _ = precision.standard_promotion(tx.update)(grads, tx.init(params), params)
  assert np.isnan(np.asarray(updates['w'])[0])
  purax.adamw(total_steps=10, eps=0.0, eps_root=1e-16)   # eps_root keeps the root positive


@pytest.mark.parametrize('value', NON_FINITE)
def test_the_setter_refuses_a_non_finite_value_of_every_hyperparameter_by_name(value):
  """Issue 28.5, every name a state carries (the optimizer's and the loss's,
  with and without a row in the bounds table): refused, the state unchanged."""
  task = purax.Task(model=purax.nn.MLP(num_classes=3, features=(4,)),
                    tx=purax.adamw(learning_rate=1e-3, total_steps=10))
  state = task.init(jax.random.key(0), {'x': np.zeros((2, 5), np.float32),
                                        'y': np.zeros((2,), np.int32)})
  names = hparams_lib.names(state)
  assert set(names) == {'learning_rate', 'weight_decay', 'b1', 'b2', 'eps', 'clip_norm',
                        'label_smoothing'}
  for name in names:
    with pytest.raises(purax.ConfigError, match=rf'^hyperparameter {name}: expected a finite '
                                                rf'value in .*, got {value}$'):
      purax.set_hyperparams(state, {name: value})


# -- the warmup-stable-decay schedule (issue #48.1: a cooldown as a hyperparameter) --------

WSD = dict(warmup_steps=10, decay_start=40.0, cooldown_steps=16.0)


def wsd_formula(t, lr=1e-3, warmup_steps=10, decay_start=40.0, cooldown_steps=16.0):
  """Hägele et al. 2024's 1-sqrt cooldown, written out in float64."""
  warm = min(t / warmup_steps, 1.0)
  p = min(max((t - decay_start) / cooldown_steps, 0.0), 1.0)
  return lr * min(warm, 1.0 - math.sqrt(p))


@pytest.mark.parametrize('count', [0, 5, 10, 25, 40, 44, 52, 56, 57, 200])
def test_the_wsd_rate_is_the_formula_before_warmup_end_stable_mid_decay_end_and_after(count):
  """Warmup (5), stable (10, 25, 40: the decay's start), mid-decay (44, 52), its
  end (56: 0) and after (57, 200: 0): the rate the state reports."""
  tx = purax.adamw(learning_rate=1e-3, total_steps=100, schedule='wsd', weight_decay=0.0,
                   clip_norm=1e30, **WSD)
  state = tx.init({'w': jnp.ones(3)})
  assert set(optim.SCHEDULE_HPARAMS['wsd']) <= set(state.hyperparams)
  state = state._replace(count=jnp.int32(count))
  expected = wsd_formula(count)
  np.testing.assert_allclose(float(tx.learning_rate(state)), expected, rtol=1e-6, atol=1e-12)
  if count >= 56:
    assert float(tx.learning_rate(state)) == 0.0


@pytest.mark.dtype_promotion('standard')   # optax.adamw itself promotes its int32 count
def test_the_wsd_updates_apply_the_formula_at_every_step():
  """60 updates of purax.adamw(schedule='wsd') against optax.adamw with the
  formula as its schedule (same moments): equal to float32 rounding (2e-5)."""
  tx = purax.adamw(learning_rate=1e-3, total_steps=100, schedule='wsd', weight_decay=0.0,
                   clip_norm=1e30, **WSD)
  ref = optax.adamw(lambda c: jnp.asarray([wsd_formula(t) for t in range(60)],
                                          jnp.float32)[c], weight_decay=0.0)
  params = {'w': jnp.linspace(-1.0, 1.0, 4)}
  state, rstate = tx.init(params), ref.init(params)
  for t in range(60):
    grads = {'w': jnp.sin(params['w'] * (t + 1))}
    updates, state = tx.update(grads, state, params)
    expected, rstate = ref.update(grads, rstate, params)
    np.testing.assert_allclose(updates['w'], expected['w'], rtol=2e-5, atol=1e-9,
                               err_msg=f'step {t}')
    assert float(tx.learning_rate(state, applied=True)) == pytest.approx(wsd_formula(t),
                                                                         rel=1e-6, abs=1e-12)
    params = optax.apply_updates(params, updates)


def test_wsd_leaves_the_other_schedules_and_their_state_as_they_were():
  tx = purax.adamw(learning_rate=1e-3, total_steps=100)
  state = tx.init({'w': jnp.ones(3)})
  assert 'decay_start' not in state.hyperparams and 'cooldown_steps' not in state.hyperparams
  with pytest.raises(purax.ConfigError, match=r"^decay_start, cooldown_steps: expected unset "
                                              r"unless schedule='wsd'"):
    purax.adamw(total_steps=10, cooldown_steps=5)
  with pytest.raises(purax.ConfigError, match=r'^cooldown_steps: expected a finite value in '
                                              r'\(0, inf\)'):
    purax.adamw(total_steps=10, schedule='wsd', cooldown_steps=0)
  # Defaults: the last 20% of total_steps.
  tx = purax.adamw(total_steps=100, schedule='wsd')
  hp = tx.init({'w': jnp.ones(3)}).hyperparams
  assert (float(hp['decay_start']), float(hp['cooldown_steps'])) == (80.0, 20.0)


def test_set_hyperparams_changes_the_wsd_cooldown_without_recompiling():
  task = purax.Task(model=purax.nn.MLP(num_classes=3, features=(4,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=100, schedule='wsd',
                                   warmup_steps=0, decay_start=0.0, cooldown_steps=4.0))
  batch = {'x': np.ones((2, 5), np.float32), 'y': np.zeros((2,), np.int32)}
  step = jax.jit(task.step)
  state = task.init(jax.random.key(0), batch)
  runs = {}
  for cooldown in (4.0, 400.0):
    s = purax.set_hyperparams(state, cooldown_steps=cooldown)
    for _ in range(6):
      s, _ = step(s, batch)
    runs[cooldown] = s
  assert step._cache_size() == 1, 'a new cooldown recompiled'
  # 4 steps of cooldown: the rate is 0 from step 4 on; 400: still near the peak.
  assert float(task.tx.learning_rate(runs[4.0].opt_state)) == 0.0
  np.testing.assert_allclose(float(task.tx.learning_rate(runs[400.0].opt_state)),
                             1e-2 * (1 - math.sqrt(6 / 400)), rtol=1e-6)
  assert not np.array_equal(runs[4.0].params['Dense_0']['kernel'],
                            runs[400.0].params['Dense_0']['kernel'])
