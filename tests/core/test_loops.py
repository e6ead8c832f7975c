"""purax.core.loops: every loop purax puts around the user's step (k steps per
call, microbatches, a population's chunks) is unrolled on the CPU when the step
holds a convolution, so XLA:CPU's convolution canonicalization, which visits the
entry computation only, gives every convolution its fast kernel; without one
the loop stays a loop. Counted in the compiled program (its ``while`` ops),
never timed. The values are those of the single steps, bitwise."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purax
from purax import plan as plan_lib
from purax import testing
from purax.core import loops
from purax.core import population as P
from purax.core.metrics import zeros_of as zero_metrics


class TinyConv(nn.Module):
  """``[batch, 4, 4, 1]`` -> ``[batch, 3]``: one convolution, one dense layer."""

  @nn.compact
  def __call__(self, x, *, train=False):
    x = nn.relu(nn.Conv(4, (3, 3))(x))
    return nn.Dense(3)(x.reshape(x.shape[0], -1))


class TinyDense(nn.Module):
  @nn.compact
  def __call__(self, x, *, train=False):
    return nn.Dense(3)(x.reshape(x.shape[0], -1))


def batch(i=0, n=8):
  rng = np.random.default_rng(i)
  return {'x': rng.normal(size=(n, 4, 4, 1)).astype(np.float32),
          'y': rng.integers(0, 3, n).astype(np.int32)}


def task(model, **kw):
  return purax.Task(model=model, tx=purax.adamw(learning_rate=1e-2, total_steps=10), **kw)


def loops_in(compiled) -> int:
  return compiled.as_text().count(' while(')


def test_unrolls_only_a_body_with_a_convolution_on_the_cpu():
  w = jnp.ones((3, 3, 1, 4))
  conv = lambda c, x: (c + jax.lax.conv_general_dilated(   # noqa: E731
      x, w, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC')).sum(), None)
  dense = lambda c, x: (c + (x * 2).sum(), None)            # noqa: E731
  x = jnp.ones((2, 4, 4, 1))
  assert loops.unrolls(conv, 0.0, x, platform='cpu')
  assert not loops.unrolls(conv, 0.0, x, platform='gpu')
  assert not loops.unrolls(dense, 0.0, x, platform='cpu')
  # Found through nested programs too (a jit, a grad, a remat inside the body).
  nested = lambda c, x: jax.jit(jax.grad(lambda x: jax.checkpoint(conv)(c, x)[0]))(x)  # noqa
  assert loops.unrolls(lambda c, x: (c + nested(c, x).sum(), None), 0.0, x, platform='cpu')


@pytest.mark.parametrize('model,expected_loops', [(TinyConv(), 0), (TinyDense(), 1)])
def test_k_steps_per_call_and_microbatches_keep_no_loop_around_a_convolution(
    model, expected_loops):
  t = task(model)
  state = t.init(jax.random.key(0), batch())
  acc = zero_metrics(lambda s, b: t.step(s, b)[1], state, batch())
  stacked = jax.tree.map(lambda *xs: np.stack(xs), batch(0), batch(1))
  multi = plan_lib.multi_train_step.lower(t, state, acc, stacked).compile()
  assert loops_in(multi) == expected_loops
  micro = task(model, microbatches=2)
  accumulated = jax.jit(micro.step).lower(state, batch()).compile()
  assert loops_in(accumulated) == expected_loops


@pytest.mark.parametrize('model,expected_loops', [(TinyConv(), 0), (TinyDense(), 1)])
def test_a_population_one_member_at_a_time_keeps_no_loop_around_a_convolution(
    model, expected_loops):
  t = task(model)
  keys = jax.vmap(jax.random.key)(jnp.arange(3))
  pop = jax.jit(P.init, static_argnums=0)(t, keys, {'learning_rate': np.float32(
      [1e-3, 1e-2, 3e-2])}, batch())
  step = jax.jit(P.step, static_argnums=0, static_argnames='strategy')
  compiled = step.lower(t, pop, batch(), strategy='sequential').compile()
  assert loops_in(compiled) == expected_loops


def test_unrolled_conv_steps_equal_single_steps_bitwise():
  t = task(TinyConv())
  data = [batch(i) for i in range(4)]
  single, _ = purax.fit(t, t.init(jax.random.key(0), data[0]), data, steps_per_call=1, hooks=purax.hooks.standard(log_every=2, progress=False))
  multi, _ = purax.fit(t, t.init(jax.random.key(0), data[0]), data, steps_per_call=2, hooks=purax.hooks.standard(log_every=2, progress=False))
  testing.assert_trees_close(multi, single, testing.Tolerance(0.0, 0.0), what='state')


@pytest.mark.parametrize('model,unrolled', [(TinyConv(), True), (TinyDense(), False)])
def test_auto_weighs_the_k_step_program_as_unrolled_when_it_is(monkeypatch, model, unrolled):
  seen = []
  monkeypatch.setattr(plan_lib.auto, 'choose_steps_per_call',
                      lambda *a, **kw: seen.append(kw.get('unrolled')) or 4)
  t = task(model)
  data = [batch(i) for i in range(8)]
  purax.fit(t, t.init(jax.random.key(1), data[0]), data, steps_per_call='auto', hooks=purax.hooks.standard(log_every=4, progress=False))
  assert bool(seen[-1]) is unrolled


def test_unrolled_programs_keep_one_steps_temporaries_not_k():
  """Compiled with loops.UNROLLED_CPU_OPTIONS (the memory-optimized scheduler),
  k unrolled steps reuse one step's temporary buffers; XLA:CPU's default
  scheduler keeps all k steps' live at once (bytes from XLA's analysis;
  measured: 1.13x one step's bytes, 2.1x under the default)."""
  t = task(TinyConv())
  state = t.init(jax.random.key(0), batch(n=64))
  acc = zero_metrics(lambda s, b: t.step(s, b)[1], state, batch(n=64))
  temp = lambda c: c.memory_analysis().temp_size_in_bytes   # noqa: E731
  single = temp(plan_lib.train_step.lower(t, state, acc, batch(n=64)).compile())
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *[batch(i, n=64) for i in range(8)])
  multi = temp(plan_lib.multi_train_step.lower(t, state, acc, stacked).compile())
  assert multi < 1.5 * single, (single, multi)


@pytest.mark.parametrize('model,unrolled', [(TinyConv(), True), (TinyDense(), False)])
def test_a_population_whose_members_loop_is_unrolled_compiles_with_the_cpu_options(
    model, unrolled):
  t = task(model)
  pop = jax.jit(P.init, static_argnums=0)(t, jax.vmap(jax.random.key)(jnp.arange(3)), {
      'learning_rate': np.full(3, 1e-3, np.float32)}, batch())
  acc = P.zero_train_metrics(t, pop, batch())
  before = P.train_step._unrolled._cache_size(), P.train_step._plain._cache_size()
  P.train_step(t, pop, acc, batch(), None, strategy='sequential')
  after = P.train_step._unrolled._cache_size(), P.train_step._plain._cache_size()
  assert (after[0] - before[0], after[1] - before[1]) == ((1, 0) if unrolled else (0, 1))
