"""Edges of the public API found by an adversarial pass: each is a clear error
naming the field, or the right behaviour."""

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

import purax
from purax import parallel, testing


def batch(i=0, key='x'):
  rng = np.random.default_rng(i)
  return {key: rng.normal(size=(8, 3)).astype(np.float32),
          'y': rng.integers(0, 3, 8).astype(np.int32)}


def task(**kw):
  return purax.Task(model=kw.pop('model', nn.Dense(3)), tx=optax.sgd(0.1), **kw)


def test_a_generator_ending_on_a_checkpoint_step_saves_and_evaluates_it_once(tmp_path):
  t = task()
  ckpt = purax.Checkpointer(str(tmp_path / 'c'))
  state, history = purax.fit(t, t.init(jax.random.key(0), batch()), (batch(i) for i in range(10)), hooks=purax.hooks.standard(log_every=5, progress=False, eval_data=[batch(99)], eval_every=5, checkpointer=ckpt, checkpoint_every=5))
  ckpt.close()
  with purax.Checkpointer(str(tmp_path / 'c')) as again:
    assert int(state.step) == 10 and again.steps() == [5, 10]
  assert [r['step'] for r in history if 'eval/loss' in r] == [5, 10]


def test_shard_map_takes_any_batch_pytree():
  t = task(model=purax.Linen(nn.Dense(3), inputs='img'))
  b = batch(key='img')
  state = t.init(jax.random.key(0), b)
  new, m = parallel.shard_map_step(t, testing.mesh_of({'data': 2}))(state, b)
  assert int(new.step) == 1


def test_a_task_rebuilt_with_the_same_adamw_values_is_equal():
  make = lambda: purax.Task(model=nn.Dense(3), tx=purax.adamw(learning_rate=1e-3,  # noqa: E731
                                                                total_steps=10))
  assert make() == make() and hash(make()) == hash(make())


@pytest.mark.parametrize('make, error, match', [
    (lambda: task(hparams={'label_smothing': 0.3}), purax.ConfigError,
     r"hparams: expected names the loss declares \(\['label_smoothing'\]\).*got unknown \['label_smothing'\]"),
    (lambda: task(model=_Deterministic()).init(jax.random.key(0), batch()), purax.ConfigError,
     r"_Deterministic.__call__: expected a call purax can make.*got required parameters \['deterministic'\]"),
    (lambda: task(model=_TwoHeads()).init(jax.random.key(0), batch()), purax.DataError,
     r'model outputs: expected \[batch, classes\] logits, got tuple'),
    (lambda: purax.fit(task(), task().init(jax.random.key(0), batch()), batch(), hooks=purax.hooks.standard(progress=False)),
     purax.ConfigError, r"train_data: expected batches .* got a dict with keys \['x', 'y'\]"),
    (lambda: purax.fit(task(), task().init(jax.random.key(0), batch()), [batch()], steps=-1, hooks=purax.hooks.standard(progress=False)), purax.ConfigError, r'steps: expected None or an integer >= 0, got -1'),
    (lambda: purax.fit(task(), task().init(jax.random.key(0), batch()), [batch()] * 4, hooks=purax.hooks.standard(progress=False, eval_data=iter([batch()]), eval_every=2)),
     purax.ConfigError, r'eval_data: expected a collection iterated afresh'),
])
def test_bad_input_is_named(make, error, match):
  with pytest.raises(error, match=match):
    make()


class _Deterministic(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic):
    return nn.Dense(3)(x)


class _TwoHeads(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(x), nn.Dense(2)(x)


@pytest.mark.parametrize('change, match', [
    (lambda b: dict(b, y=np.full(8, 3, np.int32)), r"batch\['y'\]: expected class labels in \[0, 3\), got values in \[3, 3\]"),
    (lambda b: dict(b, weight=np.full(8, -1.0, np.float32)), r"batch\['weight'\]: expected finite values >= 0"),
])
def test_fit_checks_values_of_the_first_batch_by_default(change, match):
  t = task()
  bad = change(batch())
  with pytest.raises(purax.DataError, match=match):
    purax.fit(t, t.init(jax.random.key(0), batch()), [bad], hooks=purax.hooks.standard(progress=False))
  purax.fit(t, t.init(jax.random.key(0), batch()), [bad], hooks=purax.hooks.standard(progress=False), plan=purax.plan.SingleDevicePlan(t, checks='none'))


def test_fit_checks_every_batch_when_asked():
  t = task()
  batches = [batch(0), dict(batch(1), y=np.full(8, 7, np.int32))]
  purax.fit(t, t.init(jax.random.key(0), batch()), batches, hooks=purax.hooks.standard(progress=False))   # first only
  with pytest.raises(purax.DataError, match=r"batch\['y'\]: expected class labels in \[0, 3\)"):
    purax.fit(t, t.init(jax.random.key(0), batch()), batches, hooks=purax.hooks.standard(progress=False), plan=purax.plan.SingleDevicePlan(t, checks='every'))


def test_token_ids_beyond_the_vocabulary_are_named():
  lm = purax.nn.DecoderLM(vocab_size=16, d_model=8, num_layers=1, num_heads=2, max_len=4)
  t = purax.Task(model=lm, tx=optax.sgd(0.1), loss=purax.objectives.language_model)
  b = {'x': np.full((2, 4), 20, np.int32), 'y': np.zeros((2, 4), np.int32)}
  with pytest.raises(purax.DataError, match=r"batch\['x'\]: expected token ids in \[0, 16\)"):
    purax.plan.check_values(t, b)
