"""The guarded update (purax.core.update): gradient accumulation, loss scaling,
the non-finite guard, remat and precision — each with the invariant that proves it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import purax
from purax import nn as pnn
from purax.core import metrics as metrics_lib
from purax.core import objectives, optim
from purax.core.precision import get_policy
from tests.helpers import assert_bitwise, tiny_batch, tiny_task, tree_equal, with_hyperparam


def mlp_task(**task_kwargs):
  model = pnn.MLP(num_classes=5, features=(16,))
  return purax.Task(model=model, tx=purax.adamw(learning_rate=1e-2, total_steps=50),
                    **task_kwargs)


def batch_of(n, seed, weights=False):
  return tiny_batch(n=n, shape=(6,), classes=5, seed=seed, weight=weights)


def assert_close(a, b, rtol, atol):
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=rtol,
                               atol=atol, err_msg=jax.tree_util.keystr(path))


@settings(max_examples=4)
@given(k=st.sampled_from([2, 4]), m=st.sampled_from([2, 3]), seed=st.integers(0, 2**16),
       weights=st.booleans())
def test_accumulation_over_k_microbatches_equals_one_step_on_the_whole_batch(k, m, seed, weights):
  """Tolerance rtol 1e-5 / atol 1e-6: the same float32 terms summed in another
  order (microbatch sums, then across microbatches), at highest matmul precision."""
  batch = batch_of(k * m, seed, weights)
  whole, accumulated = mlp_task(), mlp_task(microbatches=k)
  state = whole.init(jax.random.key(seed), batch)
  with jax.default_matmul_precision('highest'):
    s1, m1 = jax.jit(whole.step)(state, batch)
    s2, m2 = jax.jit(accumulated.step)(state, batch)
  assert int(s1.step) == int(s2.step) == 1        # one optimizer update, not k
  assert int(s2.opt_state.inner_state[1][0].count) == 1
  assert_close(s1.params, s2.params, rtol=1e-5, atol=1e-6)
  assert_close(s1.opt_state, s2.opt_state, rtol=1e-5, atol=1e-6)
  c1, c2 = metrics_lib.compute(m1), metrics_lib.compute(m2)
  for name in ('loss', 'accuracy', 'examples', 'grad_norm'):
    np.testing.assert_allclose(c1[name], c2[name], rtol=1e-5, err_msg=name)


def test_accumulation_needs_a_divisible_batch():
  task = mlp_task(microbatches=3)
  state = task.init(jax.random.key(0), batch_of(6, 0))
  with pytest.raises(purax.DataError, match=r"shape\[0\]: expected a multiple of microbatches=3, got 4"):
    task.step(state, batch_of(4, 0))


PLAIN, SCALED = mlp_task(), mlp_task(loss_scale=1.0)


@settings(max_examples=8)
@given(exponent=st.integers(0, 24), seed=st.integers(0, 2**16), n=st.sampled_from([4, 8]))
def test_a_power_of_two_loss_scale_gives_bitwise_the_unscaled_update(exponent, seed, n):
  """The same compiled step (the scale is state, not a constant) with scale 2**e
  and with scale 1 (no scaling): bitwise equal, since multiplying and dividing
  by a power of two is exact in float32 unless it over- or underflows. Against
  the unscaled task (another program: XLA may fuse differently) allclose."""
  batch = batch_of(n, seed)
  unscaled = SCALED.init(jax.random.key(seed), batch)
  scaled = unscaled.replace(loss_scale=unscaled.loss_scale.replace(
      scale=jnp.float32(2.0 ** exponent)))
  step = jax.jit(SCALED.step)
  s1, _ = step(unscaled, batch)
  s2, m2 = step(scaled, batch)
  assert tree_equal(s1.params, s2.params)
  assert tree_equal(s1.opt_state, s2.opt_state)
  assert metrics_lib.compute(m2)['skipped'] == 0
  plain, _ = jax.jit(PLAIN.step)(PLAIN.init(jax.random.key(seed), batch), batch)
  assert_close(plain.params, s2.params, rtol=1e-6, atol=1e-7)


# Compiled once per (task, shapes): the examples share the four programs.
_STEP = jax.jit(lambda task, state, batch: task.step(state, batch), static_argnums=0)
_INIT = jax.jit(lambda task, key, batch: task.init(key, batch), static_argnums=0)


@settings(max_examples=6)
@given(seed=st.integers(0, 2**16), scaled=st.booleans(), model=st.sampled_from(['mlp', 'resnet']))
def test_a_step_with_non_finite_gradients_leaves_the_state_bitwise_unchanged_but_the_step(
    seed, scaled, model):
  task = tiny_task(model)
  task = dataclasses.replace(task, loss_scale=2.0 ** 8 if scaled else None)
  batch = tiny_batch(seed=seed)
  state = _STEP(task, _INIT(task, jax.random.key(seed), batch), batch)[0]
  poisoned = dict(batch, x=batch['x'].copy())
  poisoned['x'][0, 0] = np.nan
  after, metrics = _STEP(task, state, poisoned)
  for field in ('params', 'opt_state', 'model_state', 'hparams'):
    assert tree_equal(getattr(after, field), getattr(state, field)), field
  assert int(after.step) == int(state.step) + 1    # steps taken: the data position
  assert tree_equal(jax.random.key_data(after.rng), jax.random.key_data(state.rng))
  computed = metrics_lib.compute(metrics)
  assert computed['skipped'] == 1 and computed['skip_streak'] == 1
  assert computed['examples'] == 0                 # the skipped batch does not count
  if scaled:
    assert float(after.loss_scale.scale) == float(state.loss_scale.scale) / 2


def test_a_step_whose_loss_is_not_finite_is_skipped_even_with_finite_gradients():
  """A loss value the gradient does not see (a stop_gradient term that is inf on a
  flagged batch): the gradients are finite, the loss is not, the step is skipped."""
  @purax.loss_function(hparams={'label_smoothing': 0.0})
  def loss(outputs, batch, hparams):
    values, weight, metrics = objectives.classification(outputs, batch, hparams)
    return values + jax.lax.stop_gradient(jnp.log(1.0 - batch['flag'])), weight, metrics

  task = dataclasses.replace(tiny_task('mlp'), loss=loss)
  batch = dict(tiny_batch(seed=0), flag=np.zeros((8,), np.float32))
  state = task.init(jax.random.key(0), batch)
  flagged = dict(batch, flag=np.eye(8, dtype=np.float32)[3])   # log(0) = -inf on one row
  after, metrics = jax.jit(task.step)(state, flagged)
  value, grads = jax.value_and_grad(lambda p: task.compute_loss(
      p, state.model_state, flagged, state.step_key())[0])(state.params)
  assert value == -np.inf and np.isfinite(float(optax.global_norm(grads)))
  computed = metrics_lib.compute(metrics)
  assert computed['skipped'] == 1 and tree_equal(after.params, state.params)
  taken, _ = jax.jit(task.step)(state, batch)
  assert not tree_equal(taken.params, state.params)


@pytest.mark.parametrize('name, value', [('learning_rate', np.nan),
                                         ('learning_rate', np.inf), ('eps', -np.inf)])
def test_a_non_finite_hyperparameter_written_into_opt_state_skips_the_update(name, value):
  """Issue 28.5: a NaN learning rate that reached ``opt_state`` past the setters
  (here by tree surgery) gave finite gradients, ``skipped 0`` and NaN params;
  the guard tests the state's hyperparameters too: skipped, state unchanged."""
  task, batch = tiny_task('mlp'), tiny_batch(seed=1)
  state = _INIT(task, jax.random.key(1), batch)
  poisoned = with_hyperparam(state, name, value)
  after, metrics = _STEP(task, poisoned, batch)
  computed = metrics_lib.compute(metrics)
  assert computed['skipped'] == 1 and computed['skip_streak'] == 1
  for field in ('params', 'opt_state', 'model_state', 'hparams'):
    assert_bitwise(getattr(after, field), getattr(poisoned, field), field)
  assert int(after.step) == int(state.step) + 1
  assert metrics_lib.compute(_STEP(task, state, batch)[1])['skipped'] == 0   # clean: applied


@pytest.mark.parametrize('model', ['mlp', 'cnn'])
def test_on_finite_batches_the_guarded_step_is_bitwise_the_unguarded_one(model):
  # The guard only chooses between the update and the old state: on finite
  # batches params, optimizer state and the merged metrics are bitwise those
  # of the plain update. (Not a promise across every model: XLA may fuse
  # the two programs differently; the ResNet's BatchNorm statistics differ in
  # the last bit.)
  from purax import plan as plan_lib
  guarded = tiny_task(model)
  plain = dataclasses.replace(guarded, skip_nonfinite=False)
  batches = [tiny_batch(seed=s) for s in range(3)]
  out = {}
  for name, task in (('guarded', guarded), ('plain', plain)):
    state = task.init(jax.random.key(0), batches[0])
    acc = purax.metrics.zeros_of(lambda st, b: task.step(st, b)[1], state, batches[0])
    for b in batches:
      state, acc = plan_lib.train_step(task, state, acc, b)
    out[name] = state, acc
  (g_state, g_acc), (p_state, p_acc) = out['guarded'], out['plain']
  data = lambda st: st.replace(rng=jax.random.key_data(st.rng))    # noqa: E731
  assert tree_equal(data(g_state), data(p_state))
  assert tree_equal({n: g_acc[n] for n in p_acc}, p_acc)
  assert float(g_acc['skipped'].value) == 0 and int(g_acc['skip_streak'].longest) == 0


def test_on_a_gpu_the_guard_is_a_select_with_the_same_numbers(monkeypatch):
  # XLA:GPU's conditional blocks the host (purax.core.loops.branch): lowered
  # for CUDA the guard and the norm are selects (the program has as many
  # conditionals as the CPU's with the select forms: only jax's constant
  # platform switch), and the select forms give bitwise the conditional's
  # updates and skips, run here on the CPU.
  from purax.core import loops
  task = mlp_task()
  batch = batch_of(8, 0)
  poisoned = dict(batch, x=np.where(np.arange(6) == 2, np.nan, batch['x']).astype(np.float32))
  state = task.init(jax.random.key(0), batch)

  def run():
    lowered = jax.jit(lambda s, b: task.step(s, b)).lower(state, batch)   # a fresh trace
    compiled = lowered.compile()
    return [compiled(state, b) for b in (batch, poisoned)], lowered, compiled.as_text()

  with_cond, _, hlo = run()
  assert 'conditional(' in hlo
  cuda = jax.jit(lambda s, b: task.step(s, b)).trace(state, batch).lower(
      lowering_platforms=('cuda',)).as_text()
  monkeypatch.setattr(loops, 'SELECT_PLATFORMS', loops.SELECT_PLATFORMS + ('cpu',))
  with_select, lowered, hlo = run()
  assert 'conditional(' not in hlo
  cpu_select = lowered.as_text()
  assert cuda.count('stablehlo.case') == cpu_select.count('stablehlo.case')
  assert cuda.count('stablehlo.select') == cpu_select.count('stablehlo.select')
  for (a, metrics_a), (b, metrics_b) in zip(with_cond, with_select):
    assert_bitwise(a.replace(rng=jax.random.key_data(a.rng)),
                   b.replace(rng=jax.random.key_data(b.rng)))
    assert_bitwise(metrics_a, metrics_b, 'metrics')
  assert metrics_lib.compute(with_select[1][1])['skipped'] == 1
  assert tree_equal(with_select[1][0].params, state.params)
  assert not tree_equal(with_select[0][0].params, state.params)


@pytest.mark.parametrize('model', ['mlp', 'cnn'])
def test_the_norm_handed_to_adamws_clipping_is_the_one_it_would_compute(model):
  # The step computes the gradients' global norm once and hands it to
  # purax.adamw's clipping (an optax extra argument); the update must be
  # bitwise the one of tx.update computing its own norm.
  task = tiny_task(model)
  batch = tiny_batch(seed=3)
  state = task.init(jax.random.key(0), batch)

  def by_hand(state):
    grads, _, _ = task.gradients(state, batch)
    updates, _ = task.tx.update(grads, state.opt_state, state.params)
    return optax.apply_updates(state.params, updates), optim.global_norm(grads)

  want, norm = jax.jit(by_hand)(state)
  assert float(norm) > 1.0                          # clipping is active here
  got, metrics = jax.jit(task.step)(state, batch)
  assert tree_equal(got.params, want)


def test_a_run_with_skipped_steps_ends_at_its_last_step_and_resumes_there(tmp_path):
  # Steps 2 and 5 have a NaN batch: their updates are skipped, the run still
  # takes all 8 steps (state.step is the data position), and the checkpoint
  # of step 4 resumes to the same final state.
  from purax import loop
  from purax.io import pipeline
  from purax.io.checkpoint import Checkpointer
  from purax.io.checkpoint.run import abstract_checkpoint
  data = tiny_batch(n=32, shape=(6,), classes=5)
  train = pipeline.train_dataset(data['x'], data['y'], batch_size=8, seed=0, num_steps=8)

  class Poisoned:
    def __len__(self):
      return len(train)

    def __getitem__(self, s):
      batch = dict(train[s])
      if s in (2, 5):
        batch['x'] = np.full_like(batch['x'], np.nan)
      return batch

  task = mlp_task()
  init = task.init(jax.random.key(0), train[0])
  with Checkpointer(str(tmp_path / 'ckpt')) as ckpt:
    straight, history = loop.fit(task, init, Poisoned(), hooks=purax.hooks.standard(log_every=4, progress=False, checkpointer=ckpt, checkpoint_every=4))
    assert int(straight.step) == 8
    assert [r['train/skipped'] for r in history if 'train/skipped' in r] == [1, 1]
    counts = [int(c) for _, c in
              optax.tree_utils.tree_get_all_with_path(straight.opt_state, 'count')]
    assert counts and set(counts) == {6}              # updates applied: 8 - 2 skipped
    tree, _, step = ckpt.restore(abstract_checkpoint(task, train[0]), step=4)
  assert step == 4 and int(tree['state'].step) == 4
  resumed, _ = loop.fit(task, purax.io.checkpoint.run.Restored(tree['state'], tree['train_metrics'], 0, None, {}), Poisoned(), hooks=purax.hooks.standard(log_every=4, progress=False))
  assert tree_equal(resumed.params, straight.params)


def test_the_loop_stops_naming_the_window_after_consecutive_skips():
  from purax import loop
  from purax.io import pipeline
  data = tiny_batch(n=32, shape=(6,), classes=5)
  data['x'][:] = np.nan
  task = mlp_task()
  train = pipeline.train_dataset(data['x'], data['y'], batch_size=8, seed=0, num_steps=20)
  state = task.init(jax.random.key(0), train[0])
  with pytest.raises(purax.core.errors.NonFiniteError,
                     match=r'expected fewer than 3 consecutive steps with non-finite gradients, '
                           r'got 5 ending in steps \(0, 5\]'):
    loop.fit(task, state, train, hooks=purax.hooks.standard(log_every=5, progress=False, max_consecutive_skips=3))


@pytest.mark.parametrize('policy', ['full', 'dots_saveable', 'nothing_saveable'])
def test_remat_changes_memory_not_values(policy):
  batch = tiny_batch()
  plain = tiny_task('resnet')
  remat = dataclasses.replace(plain, model=plain.model.clone(remat=policy))
  state = plain.init(jax.random.key(0), batch)
  grads = lambda task: jax.jit(jax.grad(lambda p: task.compute_loss(p, state.model_state, batch,
                                                             state.step_key())[0]))(state.params)
  assert_close(grads(plain), grads(remat), rtol=1e-6, atol=1e-7)


def test_remat_with_dropout_in_the_transformer_encoder():
  model = pnn.TransformerEncoder(num_classes=10, d_model=16, num_layers=2, num_heads=2,
                                 dropout_rate=0.3)
  batch = {'x': np.random.default_rng(0).normal(size=(4, 8, 8)).astype(np.float32),
           'y': np.arange(4, dtype=np.int32)}
  plain = purax.Task(model=model, tx=purax.adamw(total_steps=1))
  remat = dataclasses.replace(plain, model=model.clone(remat='full'))
  state = jax.jit(plain.init)(jax.random.key(0), batch)
  key = jax.random.key(7)
  grads = lambda task: jax.jit(jax.grad(lambda p: task.compute_loss(p, state.model_state, batch,
                                                             key)[0]))(state.params)
  g_plain, g_remat = grads(plain), grads(remat)
  assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(g_plain))
  assert_close(g_plain, g_remat, rtol=1e-6, atol=1e-7)


def test_zero_gradients_with_a_tiny_clipping_norm_give_zero_updates():
  tx = purax.adamw(learning_rate=1e-2, total_steps=10, clip_norm=1e-30, weight_decay=0.0)
  params = {'w': jnp.ones(3)}
  updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
  assert bool(jnp.all(updates['w'] == 0))
  # A zero clipping norm would zero every gradient, silently: refused by name.
  with pytest.raises(purax.ConfigError, match=r'clip_norm: expected a finite value in \(0, inf\) '
                                              r'.*0 would zero them'):
    purax.adamw(learning_rate=1e-2, total_steps=10, clip_norm=0.0)


def test_under_the_bf16_policy_masters_optimizer_and_hyperparameters_stay_float32():
  policy = get_policy('bf16')
  assert str(policy) == 'params=float32,compute=bfloat16,output=float32'
  model = pnn.CNN(num_classes=10, features=(4, 8), hidden=16, **policy.model_kwargs())
  task = purax.Task(model=model, tx=purax.adamw(learning_rate=1e-7, total_steps=10,
                                                warmup_steps=0))
  batch = tiny_batch()
  state = task.init(jax.random.key(0), batch)
  new, metrics = jax.jit(task.step)(state, batch)
  floats = lambda t: [x for x in jax.tree.leaves(t) if jnp.issubdtype(x.dtype, jnp.floating)]
  assert all(x.dtype == jnp.float32 for x in floats(new.params) + floats(new.opt_state))
  loss, aux = task.compute_loss(state.params, state.model_state, batch, state.step_key())
  assert loss.dtype == jnp.float32 and aux['outputs'].dtype == jnp.bfloat16
  # A tiny update (lr 1e-7) still moves the float32 masters; in bfloat16 it rounds away.
  moved = [bool(jnp.any(a != b)) for a, b in zip(jax.tree.leaves(new.params),
                                                 jax.tree.leaves(state.params))]
  assert all(moved)
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params)):
    big = np.abs(np.asarray(b)) > 1e-3      # where a 1e-7 step is far below bf16's spacing
    same = np.asarray(a.astype(jnp.bfloat16) == b.astype(jnp.bfloat16))
    assert same[big].all()


@pytest.mark.parametrize('spec, message', [
    ('fp9', "precision: expected one of ['bf16', 'fp16', 'fp32', 'fp8', 'auto']"),
    ('params=float32,compute=int8', "precision compute: expected one of"),
    ('weights=float32', "precision field: expected one of 'params', 'compute', 'matmul', 'output', got 'weights'"),
    ('params=float64,compute=float32,output=float32',
     "precision params: expected float32, bfloat16 or float16 .float64 needs JAX_ENABLE_X64=1"),
])
def test_bad_precision_specs(spec, message):
  with pytest.raises(purax.ConfigError, match=message.replace('[', r'\[').replace(']', r'\]')):
    get_policy(spec)


def test_each_microbatch_draws_its_own_dropout_key():
  """Issue 27.7: microbatch i's key is fold_in(step_key, i): the accumulated
  gradient of a dropout model equals the mean of the per-microbatch gradients
  under those keys (with every microbatch on the first key it would not)."""
  model = pnn.MLP(num_classes=10, features=(32,), dropout_rate=0.5)
  task = purax.Task(model=model, tx=optax.sgd(1.0), microbatches=2, skip_nonfinite=False)
  batch = tiny_batch()
  state = task.init(jax.random.key(0), batch)
  new, _ = jax.jit(task.step)(state, batch)
  key = state.step_key()
  halves = [jax.tree.map(lambda a: a[4 * i:4 * (i + 1)], batch) for i in range(2)]
  grad = lambda mb, k: jax.grad(lambda p: task.compute_loss(p, state.model_state, mb, k)[0])(  # noqa: E731
      state.params)
  own = [grad(halves[i], jax.random.fold_in(key, i)) for i in range(2)]
  first = [grad(halves[i], jax.random.fold_in(key, 0)) for i in range(2)]
  applied = jax.tree.map(lambda a, b: a - b, state.params, new.params)   # sgd(1): the gradient
  mean = lambda gs: jax.tree.map(lambda a, b: (a + b) / 2, *gs)         # noqa: E731
  assert_close(applied, mean(own), rtol=1e-5, atol=1e-6)
  assert not np.allclose(np.asarray(applied['Dense_0']['kernel']),
                         np.asarray(mean(first)['Dense_0']['kernel']), atol=1e-4)
