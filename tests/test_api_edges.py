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
  state, history = purax.fit(t, t.init(jax.random.key(0), batch()),
                             (batch(i) for i in range(10)), log_every=5, eval_every=5,
                             checkpoint_every=5, checkpointer=ckpt, eval_data=[batch(99)],
                             progress=False)
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
    (lambda: purax.fit(task(), task().init(jax.random.key(0), batch()), batch(), progress=False),
     purax.ConfigError, r"train_data: expected batches .* got a dict with keys \['x', 'y'\]"),
    (lambda: purax.fit(task(), task().init(jax.random.key(0), batch()), [batch()], steps=-1,
                       progress=False), purax.ConfigError, r'steps: expected None or an integer >= 0, got -1'),
    (lambda: purax.fit(task(), task().init(jax.random.key(0), batch()), [batch()] * 4,
                       eval_every=2, eval_data=iter([batch()]), progress=False),
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
