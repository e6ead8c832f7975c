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


def test_the_names_before_0_3_still_work_with_a_warning():
  """The sharded plan's pairs (init/init_state, step/train_step,
  shard_state/place), the protocol's helpers made private, and the moved
  modules' names: each works, with a DeprecationWarning naming the new one."""
  import importlib
  mesh = parallel.make_mesh(data=2, devices=jax.devices()[:2])
  plan = parallel.sharded(TASK, mesh, parallel.data_parallel(), DATA[0])
  with pytest.warns(DeprecationWarning, match=r'ShardedPlan.init\(key\) is deprecated: use '
                                              r'init_state'):
    old = plan.init(jax.random.key(0))
  new = plan.init_state(jax.random.key(0), DATA[0])
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(old.params),
               jax.device_get(new.params))
  with pytest.warns(DeprecationWarning, match='use place'):
    copy = plan.shard_state(new)
  with pytest.warns(DeprecationWarning, match='use train_step'):
    stepped, _ = plan.step(copy, plan.shard_batch(DATA[0]))
  assert int(stepped.step) == 1 and not new.params['Dense_0']['kernel'].is_deleted()
  with pytest.warns(DeprecationWarning, match=r'Plan.eval_batch is deprecated: use '
                                              r'Plan._eval_batch'):
    assert plan.eval_batch == plan._eval_batch
  for module, name, new_home in (
      ('purax.parallel.plan', 'Plan', 'purax.plan.protocol'),
      ('purax.parallel.plan', 'to_step', 'purax.plan.feed'),
      ('purax.parallel.step', 'ShardedPlan', 'purax.plan.sharded'),
      ('purax.io.pipeline', 'owned', 'purax.plan.feed'),
      ('purax.core.population', 'train_step', 'purax.plan.members')):
    with pytest.warns(DeprecationWarning, match=f'use {new_home}.{name}'):
      got = getattr(importlib.import_module(module), name)
    assert got is getattr(importlib.import_module(new_home), name)
  from purax.io.checkpoint import run
  assert run.restore_or_init is purax.restore_or_init          # a public path, kept


def test_a_plan_that_overrides_a_helper_by_its_name_before_0_3_still_has_it_called():
  with pytest.warns(DeprecationWarning, match=r'Old.eval_batch overrides a deprecated name '
                                              r'of purax.plan.Plan: name it _eval_batch'):
    class Old(plan_lib.SingleDevicePlan):
      seen = 0

      def eval_batch(self, state, acc, batch):
        Old.seen += 1
        return super()._eval_batch(state, acc, batch)

  assert Old._eval_batch is Old.__dict__['eval_batch']
  metrics = purax.evaluate(TASK, fresh(), DATA[:2], plan=Old(TASK))
  assert Old.seen == 2 and 'loss' in metrics


def test_the_protocol_docstring_lists_exactly_its_public_members():
  import re
  from purax.plan import protocol
  listed = set(re.findall(r'^- ``(\w+)', protocol.__doc__, re.M)) | set(
      re.findall(r'``(\w+)``', protocol.__doc__.split('Its public members, all of them:')[1]
                 .split('\n- ``start_step')[0]))
  plan = plan_lib.Plan(TASK)
  public = {n for n in dir(plan) if not n.startswith('_')}
  assert public == listed, (sorted(public - listed), sorted(listed - public))
  assert len(public) == 16
