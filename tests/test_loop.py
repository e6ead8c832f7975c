"""fit(): one compilation, no recompilation for new hyperparameter values,
host syncs only at log points."""

import dataclasses

import jax
import numpy as np
import pytest

import purax
from purax import loop
from purax.core import metrics as metrics_lib
from purax.io import pipeline
from tests.helpers import refilling, tiny_batch, tiny_task

TRACES = []


@dataclasses.dataclass(frozen=True)
class CountingTask(purax.Task):
  """Counts how often the step is traced (each trace precedes a compilation)."""

  def step(self, state, batch):
    TRACES.append(1)
    return super().step(state, batch)


def make(num_steps=12, batch_size=8):
  data = tiny_batch(n=40, shape=(8, 8, 1), seed=1)
  base = tiny_task('cnn')
  task = CountingTask(model=base.model, tx=base.tx)
  train = pipeline.train_dataset(data['x'], data['y'], batch_size=batch_size, seed=0,
                                 num_steps=num_steps)
  evals = pipeline.eval_batches(data['x'], data['y'], batch_size=16)
  return task, train, evals


def test_fit_compiles_once_and_a_new_learning_rate_does_not_recompile(monkeypatch):
  task, train, evals = make()
  TRACES.clear()
  state = task.init(jax.random.key(0), train[0])
  before = purax.plan.train_step._cache_size()
  s1, hist1 = loop.fit(task, state, train, hooks=purax.hooks.standard(log_every=4, progress=False, eval_data=evals))
  assert len(TRACES) == 1 + 1  # the step's jit trace + the (cached) eval_shape of the metrics
  assert purax.plan.train_step._cache_size() == before + 1
  state = task.init(jax.random.key(0), train[0])
  state = purax.set_hyperparams(state, learning_rate=0.5)
  s2, hist2 = loop.fit(task, state, train, hooks=purax.hooks.standard(log_every=4, progress=False, eval_data=evals))
  assert purax.plan.train_step._cache_size() == before + 1, 'a new learning rate recompiled'
  assert len(TRACES) == 2      # nothing traced again: the metrics structure is cached too
  assert hist1[0]['train/loss'] != hist2[0]['train/loss']
  assert int(s1.step) == int(s2.step) == 12


def test_host_syncs_happen_only_at_log_points(monkeypatch):
  task, train, evals = make(num_steps=12)
  calls = []
  real = metrics_lib.compute
  monkeypatch.setattr(metrics_lib, 'compute', lambda m: calls.append(1) or real(m))
  state = task.init(jax.random.key(0), train[0])
  with jax.transfer_guard('disallow'):   # no implicit transfers anywhere in the loop
    state, hist = loop.fit(task, state, train, hooks=purax.hooks.standard(log_every=5, progress=False, eval_data=evals, eval_every=0))
  # Logs at steps 5, 10, 12 and one evaluation at the end.
  assert len(calls) == 3 + 1
  assert [h['step'] for h in hist] == [5, 10, 12]         # a record per step written
  assert sum('train/examples' in h and h['train/examples'] for h in hist) == 12 * 8


@pytest.mark.parametrize('steps_per_call', [1, 2])
def test_a_cpu_fit_hands_its_step_host_batches_without_a_device_put(monkeypatch, steps_per_call):
  """On the CPU the jitted call takes each numpy batch itself: a device_put
  ahead of it made the MLP step 7% slower (plan.to_step). Evaluation too."""
  from purax.plan import feed, single
  from purax.plan import protocol as base
  task, train, evals = make(num_steps=8)
  seen = []
  real_put = feed.prefetch_to_device
  monkeypatch.setattr(feed, 'prefetch_to_device',
                      lambda *a, **k: seen.append('prefetch') or real_put(*a, **k))
  class Spy:
    def __init__(self, real):
      self.real, self._cache_size = real, getattr(real, '_cache_size', None)

    def __call__(self, task_, state, acc, batch):
      seen.extend(type(x).__name__ for x in jax.tree.leaves(batch))
      return self.real(task_, state, acc, batch)

  for module, name in ((single, 'train_step'), (single, 'multi_train_step'),
                       (base, '_eval_step')):
    monkeypatch.setattr(module, name, Spy(getattr(module, name)))
  state = task.init(jax.random.key(0), train[0])
  state, hist = loop.fit(task, state, train, steps_per_call=steps_per_call, hooks=purax.hooks.standard(log_every=4, progress=False, eval_data=evals, eval_every=4))
  assert int(state.step) == 8 and {'eval/loss', 'train/loss'} <= set().union(*hist)
  assert seen and set(seen) == {'ndarray'}, set(seen)


@pytest.mark.parametrize('steps_per_call', [1, 2, 'auto'])
def test_a_loader_that_refills_its_arrays_trains_on_the_batches_it_yielded(steps_per_call):
  """A loader may reuse its buffers once it has yielded a batch (a ring of
  preallocated arrays): fit must not read a batch after the loader refilled it."""
  task, train, _ = make(num_steps=12)
  fresh = [train[s] for s in range(12)]
  runs = []
  for data in (fresh, refilling(fresh)):
    state = task.init(jax.random.key(0), fresh[0])
    state, _ = loop.fit(task, state, data, steps=12, steps_per_call=steps_per_call, hooks=purax.hooks.standard(log_every=4, progress=False))
    runs.append(state.params)
  for a, b in zip(*map(jax.tree.leaves, runs)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('steps_per_call', [1, 'auto'])
def test_batches_are_copied_only_where_the_source_may_refill_them(steps_per_call, monkeypatch):
  """A list of batches and purax's own training dataset (new arrays at every
  read, ``fresh_batches``) go to the step as they are; an iterator's batches
  are copied once each (purax.plan.feed.owned, the one copy every stage
  makes through purax.plan.feed.own): no per-step copy a bare loop would not
  make, and none missing where a loader may refill."""
  import purax.plan.auto as auto_mod
  import purax.plan.feed as feed_mod
  copies = []
  real_owned = feed_mod.owned

  def counted(batch):
    copies.append(1)
    return real_owned(batch)

  monkeypatch.setattr(feed_mod, 'owned', counted)
  # 'auto' as a fast machine runs it: k = 2 after its 5 probe steps, kept. Step
  # 5 runs alone (copied by owned), steps 6-7 are copied into their call's
  # stack (purax.plan.feed.stacked), not by owned.
  monkeypatch.setattr(auto_mod, 'choose_steps_per_call', lambda *a, **kw: 2)
  monkeypatch.setattr(auto_mod, 'k_pays', lambda *a: True)
  task, train, _ = make(num_steps=8)
  held = [train[s] for s in range(8)]
  counts = {}
  class Unmarked:            # random access, but nothing says its reads are new arrays
    def __len__(self):
      return len(held)

    def __getitem__(self, s):
      return held[s]

  for name, data in (('list', held), ('dataset', train), ('iterator', iter(held)),
                     ('unmarked', Unmarked())):
    copies.clear()
    state = task.init(jax.random.key(0), held[0])
    loop.fit(task, state, data, steps=8, steps_per_call=steps_per_call,
             hooks=purax.hooks.standard(log_every=4, progress=False))
    counts[name] = len(copies)
  assert train.fresh_batches is True
  copied = 8 if steps_per_call == 1 else 6
  assert counts == {'list': 0, 'dataset': 0, 'iterator': copied, 'unmarked': copied}


@pytest.mark.parametrize('steps_per_call', [1, 3, 'auto'])
def test_a_batch_with_python_number_leaves_trains_like_one_without(steps_per_call):
  """Leaves jit takes as they are (a Python float, a list of ints) reach the
  step as numpy batches do on the CPU: the plan's bookkeeping reads them as jit
  sees them (loops.abstract), not by ``.shape``."""
  task, train, _ = make(num_steps=9)
  plain = [train[s] for s in range(9)]
  extra = [{**b, 'temperature': 0.5, 'ids': [1, 2]} for b in plain]
  runs = []
  for data in (plain, extra):
    state = task.init(jax.random.key(0), plain[0])
    state, _ = loop.fit(task, state, data, steps_per_call=steps_per_call, hooks=purax.hooks.standard(log_every=3, progress=False))
    runs.append(state.params)
  for a, b in zip(*map(jax.tree.leaves, runs)):
    np.testing.assert_array_equal(a, b)


def test_fit_resumes_from_the_state_step_and_learns():
  task, train, evals = make(num_steps=30)
  state = task.init(jax.random.key(0), train[0])
  straight, hist = loop.fit(task, state, train, hooks=purax.hooks.standard(log_every=10, progress=False))
  assert hist[-1]['train/loss'] < hist[0]['train/loss']
  half = pipeline.train_dataset(*(lambda d: (d['x'], d['y']))(tiny_batch(n=40, seed=1)),
                                batch_size=8, seed=0, num_steps=15)
  state = task.init(jax.random.key(0), train[0])
  mid, _ = loop.fit(task, state, half, hooks=purax.hooks.standard(log_every=10, progress=False))
  resumed, _ = loop.fit(task, mid, train, hooks=purax.hooks.standard(log_every=10, progress=False))
  for a, b in zip(jax.tree.leaves(straight.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(a, b)


def test_a_resumed_run_on_batches_of_another_global_size_is_refused_by_name(tmp_path):
  """A data position counts batches of one size (recorded in the checkpoint):
  resuming it on half-size batches (e.g. the per-device batch kept on half
  the devices) would read other examples, and is refused before any step;
  on batches of the recorded size it continues."""
  task = tiny_task('mlp')
  train = [tiny_batch(n=8, seed=s) for s in range(4)]
  state = jax.jit(task.init)(jax.random.key(0), train[0])
  with purax.Checkpointer(str(tmp_path)) as ckpt:
    loop.fit(task, state, train, steps=2, hooks=purax.hooks.standard(
        log_every=2, progress=False, checkpointer=ckpt))
  restored = purax.restore_or_init(str(tmp_path), task, jax.random.key(0), train[0])
  assert restored.extra['data'] == {'next_step': 2, 'batch_size': 8}
  half = [{k: v[:4] for k, v in b.items()} for b in train]
  with pytest.raises(purax.ConfigError, match=r'train_data batch size: expected 8 \(the global '
                     r'batch of the checkpoint resumed: its data position 2 counts batches '
                     r'of 8; .*got 4'):
    loop.fit(task, restored, half, hooks=[])
  state, _ = loop.fit(task, restored, train, hooks=[])
  assert int(state.step) == 4


def test_fit_rejects_bad_arguments():
  task, train, _ = make()
  state = task.init(jax.random.key(0), train[0])
  with pytest.raises(purax.ConfigError, match='log_every: expected >= 1, got 0'):
    loop.fit(task, state, train, hooks=purax.hooks.standard(log_every=0, progress=False))


@pytest.mark.parametrize('at', [0, 2])
def test_a_batch_of_another_shape_is_named_with_its_step(at):
  """Issue 29.5: through fit the DataError also names the step (the first batch
  too, which fit checks before anything compiles: not 'a state of another model')."""
  task = tiny_task('mlp')
  data = [tiny_batch(seed=s) for s in range(4)]
  data[at] = tiny_batch(seed=at, shape=(4, 4, 1))
  state = task.init(jax.random.key(0), data[1 - at // 2])
  with pytest.raises(purax.DataError, match=rf"^train_data batch of step {at}: batch\['x'\]"
                     r'.shape: expected \[batch, 8, 8, 1\] \(the batch task.init built the '
                     r'params from\), got \(8, 4, 4, 1\)$'):
    loop.fit(task, state, data, steps_per_call=1, hooks=[])
