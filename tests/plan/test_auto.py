"""``steps_per_call='auto'`` (purax.plan.auto): 'auto' probes, then runs the k
its rule picks, bitwise the result of single steps; its probe is timed with one
host sync; it weighs the compilation an earlier fit timed; it goes back to
single steps when the scanned step is slower; and the rule itself
(:func:`purax.plan.choose_steps_per_call`)."""

import jax
import pytest

import purax
from purax.nn import MLP
from tests.helpers import assert_bitwise
from tests.helpers_steps_per_call import STEPS, batches, run, task


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
