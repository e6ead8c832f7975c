"""The plan protocol (purax.parallel.plan.Plan): a new plan is one class, every
plan fit drives is a Plan (no adapter), and what a plan cannot do is refused
by name."""

import jax
import numpy as np
import optax
import pytest

import purax
from purax import parallel
from purax import plan as plan_lib
from tests.helpers import tiny_batch, tiny_task

STEPS = 6
TASK = tiny_task('mlp', total_steps=STEPS)
DATA = [tiny_batch(seed=s) for s in range(STEPS)]
QUIET = dict(log_every=2, progress=False)


class Counting(plan_lib.Plan):
  """A whole new plan in one class: the step jitted here, every call counted."""

  def __init__(self, task):
    super().__init__(task)
    self.calls = 0
    self._step = jax.jit(lambda s, acc, b: (lambda out: (out[0], purax.metrics.merge(
        acc, out[1])))(task.step(s, b)), donate_argnums=(0, 1))

  def train_step(self, state, acc, batch):
    self.calls += 1
    with plan_lib.host_batch_transfer():
      return self._step(state, acc, batch)


def fresh():
  return jax.jit(TASK.init)(jax.random.key(0), DATA[0])


def test_a_new_plan_is_one_class_and_trains_as_the_single_device_plan():
  plan = Counting(TASK)
  mine, h1 = purax.fit(TASK, fresh(), DATA, plan=plan, hooks=purax.hooks.standard(**QUIET))
  single, h2 = purax.fit(TASK, fresh(), DATA, steps_per_call=1,
                         hooks=purax.hooks.standard(**QUIET))
  assert plan.calls == STEPS
  assert [r['step'] for r in h1] == [r['step'] for r in h2] == [2, 4, 6]
  np.testing.assert_array_equal(mine.params['Dense_0']['kernel'],
                                single.params['Dense_0']['kernel'])


def test_every_plan_fit_drives_is_a_plan():
  mesh = parallel.make_mesh(data=2, devices=jax.devices()[:2])
  assert isinstance(parallel.sharded(TASK, mesh, parallel.data_parallel(), DATA[0]),
                    plan_lib.Plan)
  assert isinstance(plan_lib.SingleDevicePlan(TASK), plan_lib.Plan)
  assert isinstance(plan_lib.PopulationPlan(TASK), plan_lib.Plan)


def test_for_task_keeps_the_placement_and_steps_the_other_task():
  """A plan for another task (the EMA of a schedule-free optimizer's average
  evaluates the plain task) without a test of the plan's type: every plan
  answers ``for_task`` with its own kind, placement and settings."""
  other = tiny_task('mlp', total_steps=STEPS + 1)
  mesh = parallel.make_mesh(data=2, devices=jax.devices()[:2])
  for plan in (plan_lib.SingleDevicePlan(TASK, checks='every'), plan_lib.PopulationPlan(TASK),
               parallel.sharded(TASK, mesh, parallel.data_parallel(), DATA[0], checks='none')):
    moved = plan.for_task(other)
    assert type(moved) is type(plan) and moved.task is other and plan.task is TASK
    assert (moved.checks, moved.prefetch) == (plan.checks, plan.prefetch)
    assert moved.state_sharding == plan.state_sharding if moved.state_sharding is None else (
        moved.mesh is plan.mesh and moved.rules == plan.rules)
  # Its functions step the other task: here an optimizer that does not move.
  still = purax.Task(model=TASK.model, tx=optax.sgd(0.0))
  sharded = parallel.sharded(TASK, mesh, parallel.data_parallel(), DATA[0]).for_task(still)
  start = sharded.init(jax.random.key(0))
  before = jax.device_get(start.params)
  state, _ = sharded.step(start, sharded.shard_batch(DATA[0]))
  assert int(state.step) == 1
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), before)


def test_no_module_tests_a_plan_s_type():
  """Issue 26: what differs between plans is a method of the protocol, never
  an isinstance / hasattr test on a plan outside its argument check."""
  import pathlib
  import re
  root = pathlib.Path(purax.__file__).parent
  found = [f'{path.relative_to(root)}:{i}' for path in root.rglob('*.py')
           for i, line in enumerate(path.read_text().splitlines(), 1)
           if re.search(r'(isinstance|hasattr)\(plan\b[^)]*\)', line)
           and "'None or a purax.plan.Plan'" not in line
           and 'isinstance(plan, Plan)' not in line]
  assert not found, found


def test_several_steps_per_call_on_another_plan_is_a_named_error():
  mesh = parallel.make_mesh(data=2, devices=jax.devices()[:2])
  plan = parallel.sharded(TASK, mesh, parallel.data_parallel(), DATA[0])
  with pytest.raises(purax.ConfigError, match=r"steps_per_call: expected 1 or 'auto' with a "
                                              r'ShardedPlan .*got 2'):
    purax.fit(TASK, plan.init(jax.random.key(0)), DATA, plan=plan, steps_per_call=2,
              hooks=purax.hooks.standard(**QUIET))


@pytest.mark.parametrize('checks', ['first', 'every', 'none'])
def test_the_plan_checks_batch_values_as_asked(checks):
  bad = [dict(b) for b in DATA]
  bad[3]['y'] = np.full_like(bad[3]['y'], 99)          # 10 classes: out of range at step 3
  run = lambda: purax.fit(TASK, fresh(), bad, hooks=[],   # noqa: E731
                          plan=plan_lib.SingleDevicePlan(TASK, checks=checks))
  if checks == 'every':
    with pytest.raises(purax.DataError, match=r"batch\['y'\]"):
      run()
  else:
    state, _ = run()                                     # first: only batch 0 is read
    assert int(state.step) == STEPS
  with pytest.raises(purax.ConfigError, match=r"checks: expected 'first', 'every' or 'none'"):
    plan_lib.SingleDevicePlan(TASK, checks='some')


@pytest.mark.parametrize('where', ['single', 'sharded'])
def test_evaluation_batches_are_checked_as_training_batches(where):
  """Issue 27.5: a label outside the model's classes in the evaluation data is a
  DataError naming it, as in the training data (it used to be evaluated)."""
  mesh = parallel.make_mesh(data=2, devices=jax.devices()[:2])

  def plan_and_state(checks):
    if where == 'single':
      return plan_lib.SingleDevicePlan(TASK, checks=checks), fresh()
    plan = parallel.sharded(TASK, mesh, parallel.data_parallel(), DATA[0], checks=checks)
    return plan, plan.init(jax.random.key(0))

  bad = dict(DATA[0], y=np.full_like(DATA[0]['y'], 10))   # 10 classes: [0, 10)
  plan, state = plan_and_state('first')
  with pytest.raises(purax.DataError, match=r"batch\['y'\]: expected .*\[0, 10\)"):
    purax.evaluate(TASK, state, [bad], plan=plan)
  plan, state = plan_and_state('none')
  assert np.isfinite(purax.evaluate(TASK, state, [bad], plan=plan)['loss'])


def test_a_plan_lowers_its_step_for_a_dry_run():
  state = jax.eval_shape(TASK.init, jax.random.key(0), DATA[0])
  acc = purax.metrics.zeros_of(lambda s, b: TASK.step(s, b)[1], state, DATA[0])
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), DATA[0])
  compiled = plan_lib.SingleDevicePlan(TASK).lower(state, acc, batch).compile()
  assert compiled.cost_analysis() is not None
