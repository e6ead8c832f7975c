"""fit(steps_per_call=k): k steps per dispatch equal k single steps bitwise on
CPU, a non-finite batch among them included, and resume mid-run is exact;
'auto' probes, then runs the k its rule picks, with the same result."""

import jax
import numpy as np
import pytest

import purax
from purax import plan as plan_lib
from purax import testing
from purax.core.errors import DataError
from purax.io.checkpoint import Checkpointer
from purax.nn import MLP
from tests.helpers import assert_bitwise, refilling

STEPS = 12


def batches():
  out = []
  for i in range(STEPS):
    rng = np.random.default_rng(i)
    b = {'x': rng.normal(size=(8, 5)).astype(np.float32),
         'y': rng.integers(0, 3, 8).astype(np.int32)}
    if i == 5:
      b['x'][0, 0] = np.nan        # a non-finite step: skipped, counted
    out.append(b)
  return out


def task():
  return purax.Task(model=MLP(num_classes=3, features=(16,), dropout_rate=0.1),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=STEPS))


def run(k, state=None, steps=None, **kw):
  t = task()
  state = state or t.init(jax.random.key(0), batches()[0])
  hooks = purax.hooks.standard(**{'log_every': 4, 'progress': False, **kw})
  return purax.fit(t, state, batches(), steps=steps, steps_per_call=k, hooks=hooks)




@pytest.mark.parametrize('k', [2, 4])
def test_k_steps_per_call_equal_k_single_steps_bitwise(k):
  single, h1 = run(1)
  multi, hk = run(k)
  assert_bitwise(multi, single)
  logged = lambda h: [(r['step'], {n: v for n, v in r.items() if n.startswith('train/')})
                      for r in h]
  assert logged(hk) == logged(h1)
  assert sum(r['train/skipped'] for r in h1) == 1          # the NaN batch was skipped


def test_multi_step_resume_from_a_mid_run_checkpoint_is_exact(tmp_path):
  expected, _ = run(1)
  ckpt = Checkpointer(str(tmp_path / 'c'))
  stop_after = iter([False, True])                          # stop at the second call (step 8)
  half, _ = run(4, checkpointer=ckpt, checkpoint_every=4, should_stop=lambda: next(stop_after))
  ckpt.close()
  assert int(half.step) == 8
  t = task()
  restored = purax.restore_or_init(str(tmp_path / 'c'), t, jax.random.key(0), batches()[0])
  final, _ = run(4, state=restored)
  assert_bitwise(final, expected)


def test_steps_per_call_must_divide_the_cadences():
  with pytest.raises(purax.ConfigError, match='log_every: expected a multiple of steps_per_call=3'):
    run(3)


def test_a_tail_shorter_than_k_runs_as_single_steps_bitwise():
  # 10 steps at k=4: two calls of 4, then steps 8 and 9 one at a time (the
  # one-step program, not a scan of 2); the same state as 10 single steps.
  single, h1 = run(1, steps=10)
  multi, hk = run(4, steps=10)
  assert_bitwise(multi, single)
  assert [r['step'] for r in hk] == [r['step'] for r in h1] == [4, 8, 10]


def test_a_call_holds_its_own_copy_of_each_batch_from_a_refilling_loader():
  # Resumed at step 2 with k = 4 and 12 batches: steps 2-3 single (passed on as
  # they are), calls of steps 4-7 and 8-11, then the tail, steps 12-13, single.
  fresh = batches()
  out = list(plan_lib.feed.stacked(refilling(fresh), 2, 4))
  assert [isinstance(o, plan_lib.Stacked) for o in out] == [False, False, True, True, False,
                                                            False]
  for call, first in zip(out[2:4], (2, 6)):
    for key in ('x', 'y'):
      np.testing.assert_array_equal(call.batches[key],
                                    np.stack([b[key] for b in fresh[first:first + 4]]))
  assert not np.shares_memory(out[2].batches['x'], out[3].batches['x'])
  for single, batch in zip(out[4:], fresh[10:]):
    assert not np.shares_memory(single['x'], out[0]['x'])   # not the loader's buffer
    np.testing.assert_array_equal(single['x'], batch['x'])


def test_a_call_of_batches_that_differ_in_shape_or_dtype_is_a_clear_error():
  data = batches()
  for changed in ({**data[1], 'x': data[1]['x'][:, :4]},
                  {**data[1], 'y': data[1]['y'].astype(np.float32)}):
    t = task()
    state = t.init(jax.random.key(0), data[0])
    with pytest.raises(DataError, match=r'train_data batch of step 1: expected the structure, '
                                        r'shapes and dtypes of the first batch of its call of '
                                        r'steps_per_call=2'):
      purax.fit(t, state, [data[0], changed] + data[2:], steps_per_call=2, hooks=purax.hooks.standard(log_every=4, progress=False))

def test_auto_runs_probe_steps_then_the_chosen_k_bitwise(monkeypatch):
  # 'auto' times 5 single steps, then runs k per call; steps 5-7 realign one
  # at a time, 8-11 are one call. The choice is forced to 4 here (the timing
  # rule itself is tested below), so the test does not depend on the machine.
  from purax import plan as plan_lib
  chosen = []
  monkeypatch.setattr(plan_lib.auto, 'choose_steps_per_call',
                      lambda *a, **kw: chosen.append(a) or 4)
  single, h1 = run(1)
  calls = []
  real = plan_lib.multi_train_step
  monkeypatch.setattr(plan_lib.single, 'multi_train_step',
                      lambda *a: calls.append(len(jax.tree.leaves(a[3])[0])) or real(*a))
  auto, ha = run('auto')
  assert_bitwise(auto, single)
  assert calls == [4]                                       # steps 8-11; 0-7 one at a time
  assert chosen and all(c[3] == 4 for c in chosen)          # the cadence: log_every=4


def test_auto_times_its_probe_with_one_host_sync(monkeypatch):
  # The probe times the first call on the host (its compilation) and the
  # probe steps' run by one block_until_ready after the last of them: 'auto'
  # that settles on k = 1 syncs once more than k = 1, not once per probe step.
  from purax import plan as plan_lib
  chosen = []
  monkeypatch.setattr(plan_lib.auto, 'choose_steps_per_call',
                      lambda *a, **kw: chosen.append(a) or 1)
  syncs = []
  real = jax.block_until_ready
  monkeypatch.setattr(jax, 'block_until_ready', lambda x: syncs.append(1) or real(x))
  run(1)
  single = len(syncs)
  del syncs[:]
  run('auto')
  assert len(syncs) == single + 1
  step_s, _, remaining, _ = chosen[-1]
  assert step_s > 0 and remaining == STEPS - plan_lib.PROBE_STEPS


def test_auto_weighs_the_compilation_an_earlier_single_step_fit_timed(monkeypatch):
  # A fit with steps_per_call=1 times its first call's compilation (the jit's
  # cache grew); a later 'auto' fit of the same task finds its one-step program
  # cached and weighs k > 1 against that compilation, not its own ~0 s call.
  # A program compiled outside any timed first call has an unknown cost: inf.
  import math
  from purax import plan as plan_lib
  t = purax.Task(model=MLP(num_classes=3, features=(23,)),     # shapes no other test compiles
                 tx=purax.adamw(learning_rate=1e-2, total_steps=STEPS))
  fit = lambda k: purax.fit(t, t.init(jax.random.key(0), batches()[0]), batches(), steps_per_call=k, hooks=purax.hooks.standard(log_every=4, progress=False))
  fit(1)
  [compile_s] = [s for key, s in plan_lib.auto.COMPILED.one_step.items() if key[0] == t]
  assert compile_s > 0
  chosen = []
  monkeypatch.setattr(plan_lib.auto, 'choose_steps_per_call', lambda *a, **kw: chosen.append(a) or 1)
  fit('auto')
  assert chosen[-1][1] == compile_s
  monkeypatch.setattr(plan_lib.auto.COMPILED, 'one_step', {})
  fit('auto')
  assert chosen[-1][1] == math.inf


@pytest.mark.parametrize('step_s, compile_s, remaining, cadence, expected', [
    (1e-3, 0.0, None, 100, 10),      # 10 ms per call: 10 steps, a divisor of 100
    (1e-3, 0.0, None, 50, 10),
    (1e-3, 0.0, None, 4, 4),         # the largest divisor of the cadence <= 10
    (3e-3, 0.0, None, 100, 4),       # ceil(10 / 3) = 4
    (1e-5, 0.0, None, 64, 32),       # capped at 32 batches per call
    (0.2, 0.0, None, 100, 1),        # a large step: one per call
    (1e-3, 2.0, 300, 100, 1),        # 300 steps do not pay a 2 s compilation
    (1e-3, 2.0, 100_000, 100, 10),   # 100k steps do
])
def test_the_auto_rule(step_s, compile_s, remaining, cadence, expected):
  from purax.plan import choose_steps_per_call
  assert choose_steps_per_call(step_s, compile_s, remaining, cadence) == expected


def test_the_auto_rule_counts_a_larger_saving_on_accelerators():
  """5,000 steps of 1 ms pay a 2 s compilation where k > 1 saves half the step
  (an accelerator, where a small step is mostly dispatch), not where it saves a
  tenth (CPU); the default platform is the backend's (CPU here)."""
  from purax.plan import choose_steps_per_call
  args = (1e-3, 2.0, 5000, 100)
  assert choose_steps_per_call(*args, platform='gpu') == 10
  assert choose_steps_per_call(*args, platform='tpu') == 10
  assert choose_steps_per_call(*args, platform='cpu') == 1
  assert choose_steps_per_call(*args) == 1


@pytest.mark.parametrize('remaining, unrolled, expected', [
    (5_000, False, 4),       # saves 1.5 s (10% of 3 ms x 5,000) > 1 s: the largest k
    (5_000, True, 1),        # 2 x 1 s of compilation for even k = 2 does not pay
    (12_000, True, 2),       # 3.6 s pays for k = 2 (2 s), not k = 4 (4 s)
    (20_000, True, 4),       # 6 s pays for k = 4
])
def test_the_auto_rule_weighs_an_unrolled_program_k_times(remaining, unrolled, expected):
  """A CNN's k-step program on the CPU is unrolled (purax.core.loops) and
  compiles about k times as long as the single step."""
  from purax.plan import choose_steps_per_call
  assert choose_steps_per_call(3e-3, 1.0, remaining, 100, platform='cpu',
                               unrolled=unrolled) == expected


@pytest.mark.parametrize('k', [0, -1, 2.0, 'fast'])
def test_steps_per_call_is_an_integer_or_auto(k):
  with pytest.raises(purax.ConfigError, match='steps_per_call'):
    run(k)


def test_auto_goes_back_to_single_steps_when_the_scanned_step_is_slower(monkeypatch):
  # Forced k=2 with a scanned step made slow: the first two calls of 2 are
  # timed, found slower per step than the single steps, and the rest (the
  # third stack already built: sliced) runs one step per call; same state.
  import time
  from purax import plan as plan_lib
  monkeypatch.setattr(plan_lib.auto, 'choose_steps_per_call', lambda *a, **kw: 2)
  single, _ = run(1)
  calls = []
  real = plan_lib.multi_train_step

  def slow(*a):
    calls.append(1)
    time.sleep(0.5)
    return real(*a)

  monkeypatch.setattr(plan_lib.single, 'multi_train_step', slow)
  t = task()
  plan = plan_lib.SingleDevicePlan(t)
  auto, _ = purax.fit(t, t.init(jax.random.key(0), batches()[0]), batches(), plan=plan,
                      steps_per_call='auto',
                      hooks=purax.hooks.standard(log_every=4, progress=False))
  assert_bitwise(auto, single)
  assert len(calls) == 2 and plan.chosen_steps_per_call == 1
