"""fit over any data source: random access, a grain IterDataset (its iterator
position checkpointed: SIGTERM + resume is bitwise the straight run), and a
plain generator (resume refuses, warns or skips, as the user chooses)."""

import signal
import warnings

import grain
import jax
import numpy as np
import pytest

import purax
from purax import testing
from purax.io.checkpoint import Checkpointer
from purax.nn import MLP
from tests.helpers import assert_bitwise

STEPS = 12


def make_batch(i):
  rng = np.random.default_rng(int(i))
  return {'x': rng.normal(size=(8, 5)).astype(np.float32),
          'y': rng.integers(0, 3, 8).astype(np.int32)}


def task():
  return purax.Task(model=MLP(num_classes=3, features=(16,), dropout_rate=0.1),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=STEPS))


def iter_dataset():
  # shuffled with a seed, so the position is more than a counter
  return grain.MapDataset.range(40).shuffle(seed=3).map(make_batch).to_iter_dataset()


def generator():
  for i in range(STEPS):
    yield make_batch(i)


class SignalAt:
  """A metric writer that sends this process SIGTERM at a log point."""

  def __init__(self, step):
    self.step, self.records = step, []

  def write_scalars(self, step, scalars):
    self.records.append(step)
    if step == self.step:
      signal.raise_signal(signal.SIGTERM)

  def flush(self):
    pass

  def close(self):
    pass


def straight(data, **kw):
  t = task()
  state = t.init(jax.random.key(0), make_batch(0))
  return purax.fit(t, state, data, steps=STEPS, **kw, hooks=purax.hooks.standard(log_every=2, progress=False))[0]




def test_grain_iter_dataset_sigterm_and_resume_equal_the_straight_run(tmp_path):
  expected = straight(iter_dataset())
  t = task()
  ckpt = Checkpointer(str(tmp_path / 'ckpt'), keep_last=2)
  state = t.init(jax.random.key(0), make_batch(0))
  with purax.StopOnSignal() as stop:
    state, _ = purax.fit(t, state, iter_dataset(), steps=STEPS, hooks=purax.hooks.standard(log_every=2, progress=False, writer=SignalAt(6), checkpointer=ckpt, checkpoint_every=4, should_stop=stop))
  assert stop.received == 'SIGTERM' and int(state.step) == 6
  ckpt.close()
  restored = purax.restore_or_init(str(tmp_path / 'ckpt'), t, jax.random.key(99), make_batch(0))
  assert restored.step == 6 and restored.data_state is not None
  final, _ = purax.fit(t, restored, iter_dataset(), steps=STEPS, hooks=purax.hooks.standard(log_every=2, progress=False))
  assert int(final.step) == STEPS
  assert_bitwise(final, expected)


def test_random_access_and_an_iterable_of_the_same_batches_train_alike():
  batches = [make_batch(i) for i in range(STEPS)]
  assert_bitwise(straight(batches), straight(iter(batches)))


def _half_run(tmp_path):
  t = task()
  state = t.init(jax.random.key(0), make_batch(0))
  ckpt = Checkpointer(str(tmp_path / 'ckpt'))
  gen = generator()
  state, _ = purax.fit(t, state, gen, steps=6, hooks=purax.hooks.standard(log_every=2, progress=False, checkpointer=ckpt))
  ckpt.close()
  return t, purax.restore_or_init(str(tmp_path / 'ckpt'), t, jax.random.key(0), make_batch(0))


def test_a_generator_resume_refuses_by_default_and_skips_exactly_when_asked(tmp_path):
  t, restored = _half_run(tmp_path)
  assert restored.step == 6 and restored.data_state is None
  with pytest.raises(purax.ConfigError, match='cannot be repositioned'):
    purax.fit(t, restored.state, generator(), steps=STEPS, hooks=purax.hooks.standard(progress=False))
  final, _ = purax.fit(t, restored, generator(), steps=STEPS, iterator_resume='skip', hooks=purax.hooks.standard(log_every=2, progress=False))
  assert_bitwise(final, straight(generator()))


def test_a_generator_resume_can_warn_and_continue_on_what_comes_next(tmp_path):
  t, restored = _half_run(tmp_path)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    final, history = purax.fit(t, restored.state, generator(), steps=STEPS, iterator_resume='warn', hooks=purax.hooks.standard(log_every=2, progress=False))
  messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
  assert any('the data position is not restored' in m for m in messages)
  assert int(final.step) == STEPS


def test_an_iterable_that_ends_early_ends_training_with_a_final_log_and_save(tmp_path):
  t = task()
  ckpt = Checkpointer(str(tmp_path / 'ckpt'))
  state, history = purax.fit(t, t.init(jax.random.key(0), make_batch(0)), (make_batch(i) for i in range(5)), hooks=purax.hooks.standard(log_every=2, progress=False, eval_data=[make_batch(99)], checkpointer=ckpt))
  ckpt.close()
  assert int(state.step) == 5
  assert [r['step'] for r in history if 'train/loss' in r] == [2, 4, 5]
  assert any('eval/loss' in r for r in history)
  with Checkpointer(str(tmp_path / 'ckpt')) as again:
    assert again.steps() == [5]


def test_fit_takes_what_restore_or_init_returns(tmp_path):
  t, restored = _half_run(tmp_path)
  final, _ = purax.fit(t, restored, generator(), steps=STEPS, iterator_resume='skip', hooks=purax.hooks.standard(log_every=2, progress=False))
  assert_bitwise(final, straight(generator()))


def test_fit_refuses_a_state_whose_arrays_a_donation_deleted():
  t = task()
  state = t.init(jax.random.key(0), make_batch(0))
  purax.fit(t, state, [make_batch(0)], hooks=purax.hooks.standard(progress=False))          # donates state
  with pytest.raises(purax.ConfigError, match=r'state: expected live arrays \(fit donates'):
    purax.fit(t, state, [make_batch(0)], hooks=purax.hooks.standard(progress=False))
