"""When fit saves: the checkpointer's wall-clock cadence (``interval_s``, orbax's
``ContinuousCheckpointingPolicy`` timed from the checkpointer's creation), the
explicit ``checkpoint_every``, the stop and the end; and that a checkpoint the
wall-clock cadence took resumes exactly.

No test waits for the clock: an interval far longer than the test never comes
due, and the policy's start time is moved into the past to make it due now.
"""

import datetime

import jax
import pytest

import purax
from purax.io.checkpoint import Checkpointer, CheckpointError
from purax.io.checkpoint.run import Restored, abstract_checkpoint
from tests.helpers import tiny_batch, tiny_task, tree_equal

STEPS, LOG = 12, 2
TASK = tiny_task('mlp', total_steps=STEPS)
DATA = [tiny_batch(seed=s) for s in range(STEPS)]
NEVER = 10 ** 9   # seconds: an interval no test lives to see


def run(checkpointer=None, state=None, steps=STEPS, log_every=LOG, **kwargs):
  state = jax.jit(TASK.init)(jax.random.key(0), DATA[0]) if state is None else state
  hooks = purax.hooks.standard(**{'log_every': log_every, 'progress': False,
                                  'checkpointer': checkpointer, **kwargs})
  return purax.fit(TASK, state, DATA, steps=steps, hooks=hooks)


def backdate(ckpt, seconds):
  """Moves the interval clock's start ``seconds`` into the past."""
  policy = ckpt._manager._save_decision_policy   # the policy orbax consults
  policy.started.time -= datetime.timedelta(seconds=seconds)


def saved(tmp_path, ckpt_kwargs, prepare=None, **fit_kwargs):
  """The steps a fresh run saved, in a new directory under ``tmp_path``."""
  directory = str(tmp_path / f'c{len(list(tmp_path.iterdir()))}')
  ckpt = Checkpointer(directory, keep_last=100, async_save=False, **ckpt_kwargs)
  if prepare is not None:
    prepare(ckpt)
  run(ckpt, **fit_kwargs)
  ckpt.close()
  return Checkpointer(directory).steps()


def test_default_cadence_of_a_short_run_is_the_final_save_only(tmp_path):
  # The default interval (300 s) does not come due in a short run, and the
  # clock starts at the checkpointer's creation: no save at the first log
  # point (what orbax's policy alone does in an empty directory).
  assert Checkpointer(str(tmp_path / 'd')).interval_s == 300.0
  assert saved(tmp_path, {}) == [STEPS]


def test_a_due_interval_saves_at_the_next_log_point_then_waits_again(tmp_path):
  # Due at once (the clock started an hour ago): saved at the first log point;
  # the next save is again an interval away, so only the final one follows.
  assert saved(tmp_path, {'interval_s': 3600}, prepare=lambda c: backdate(c, 7200)) \
      == [LOG, STEPS]


def test_a_zero_interval_saves_at_every_log_point_and_explicit_steps_still_apply(tmp_path):
  assert saved(tmp_path, {'interval_s': 1e-9}) == list(range(LOG, STEPS + 1, LOG))
  assert saved(tmp_path, {'interval_s': NEVER}, checkpoint_every=5, log_every=1) == [5, 10, STEPS]
  assert saved(tmp_path, {'interval_s': None}, checkpoint_every=4) == [4, 8, STEPS]


def test_a_stop_saves_whatever_the_cadence(tmp_path):
  stops = iter([False, False, True])
  assert saved(tmp_path, {'interval_s': NEVER}, should_stop=lambda: next(stops)) == [3]


def test_resume_from_an_interval_checkpoint_equals_the_straight_run_bitwise(tmp_path):
  straight, _ = run()
  ckpt = Checkpointer(str(tmp_path / 'c'), interval_s=3600, async_save=False)
  backdate(ckpt, 7200)
  stops = iter([False] * (2 * LOG - 1) + [True])       # stop at step 4
  run(ckpt, should_stop=lambda: next(stops))
  ckpt.close()
  assert Checkpointer(str(tmp_path / 'c')).steps() == [LOG, 2 * LOG]
  ckpt = Checkpointer(str(tmp_path / 'c'), interval_s=3600)
  restored = Restored.of(*ckpt.restore(abstract_checkpoint(TASK, DATA[0]), step=LOG))
  ckpt.close()
  assert restored.step == LOG and restored.extra['data']['next_step'] == LOG
  resumed, _ = run(state=restored)
  assert tree_equal(jax.random.key_data(resumed.rng), jax.random.key_data(straight.rng))
  assert tree_equal(resumed.replace(rng=None), straight.replace(rng=None))


@pytest.mark.parametrize('bad', [-1, float('nan'), float('inf'), '300'])
def test_a_bad_interval_is_named(tmp_path, bad):
  with pytest.raises(CheckpointError, match=r'interval_s: expected None or seconds >= 0, got'):
    Checkpointer(str(tmp_path / 'c'), interval_s=bad)
