"""Spike rollback (purax.hooks.SpikeRollback): an injected spike (batch 25
scaled by 1e3) is rolled back and replayed exactly; reruns and resumes
across the rollback end bitwise equal."""

import itertools
import json
import os

import jax
import numpy as np
import pytest

import purax
from purax.core.errors import ConfigError
from purax.io import writers
from purax.io.checkpoint import Checkpointer
from purax.nn import MLP

SPIKE_AT = 25


class Data:
  """Random-access batches; batch ``spike_at`` scaled by 1e3 (a garbage batch)."""

  def __init__(self, n=60, spike_at=SPIKE_AT, order=None):
    self.n, self.spike_at, self.order = n, spike_at, order

  def __len__(self):
    return self.n if self.order is None else len(self.order)

  def __getitem__(self, i):
    i = i if self.order is None else self.order[i]
    rng = np.random.default_rng(i)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    if i == self.spike_at:
      x = x * 1e3
    return {'x': x, 'y': rng.integers(0, 3, 16).astype(np.int32)}


def task():
  return purax.Task(model=MLP(num_classes=3, features=(8,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=40),
                    spike_guard=purax.SpikeGuard(window=8, k=4.0))


def leaves(state):
  return [np.asarray(jax.random.key_data(x)) if jax.dtypes.issubdtype(
      x.dtype, jax.dtypes.prng_key) else np.asarray(x) for x in jax.tree.leaves(state)]


def assert_equal(a, b):
  for x, y in zip(leaves(a), leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


def run(data=None, steps=40, rollback=True, directory=None, stop_after=0, **options):
  t, data = task(), Data() if data is None else data
  hooks = purax.hooks.standard(log_every=10, progress=False, writer=writers.MultiWriter([]),
                               max_consecutive_skips=None)
  rollback_hook = None
  if rollback:
    rollback_hook = purax.hooks.SpikeRollback(10, every=5, **options)
    hooks.append(rollback_hook)
  state = t.init(jax.random.key(0), data[0])
  ckpt = None
  if directory is not None:
    state = purax.restore_or_init(directory, t, jax.random.key(0), data[0], hooks=hooks)
    ckpt = Checkpointer(directory)
    calls = itertools.count(1)
    hooks = purax.hooks.standard(
        log_every=10, progress=False, writer=writers.MultiWriter([]), checkpointer=ckpt,
        checkpoint_every=5, max_consecutive_skips=None,
        should_stop=lambda: bool(stop_after) and next(calls) >= stop_after) + [rollback_hook]
  try:
    state, history = purax.fit(t, state, data, steps=steps, hooks=hooks, steps_per_call=1)
  finally:
    if ckpt is not None:
      ckpt.close()
  return state, history, rollback_hook


@pytest.mark.parametrize('copy', ['host', 'device'])
def test_skip_data_rolls_back_and_equals_a_run_without_the_skipped_data(monkeypatch, copy):
  # 'device': the snapshots an accelerator takes (a device copy read to the host in a
  # thread), taken on the CPU.
  from purax.hooks import rollback
  monkeypatch.setattr(rollback, '_in_host_memory', lambda leaves: copy == 'host')
  state, history, hook = run()
  assert all(isinstance(leaves, list) == (copy == 'host') for _, leaves in hook.ring)
  assert hook.events == [{'step': 30, 'spikes': 1, 'to_step': 20, 'action': 'skip-data',
                          'offset': 10}]
  (event,) = [r for r in history if 'rollback/from_step' in r]
  assert event['step'] == 30 and event['rollback/to_step'] == 20
  assert event['rollback/skip_data_steps'] == 10
  assert int(state.step) == 40
  # Steps 20..39 trained on batches 30..49: exactly a run without the spike's window.
  spliced, _, _ = run(Data(order=list(range(20)) + list(range(30, 60))), rollback=False)
  assert_equal(state, spliced)


def test_lower_lr_replays_the_window_with_the_rate_scaled():
  state, history, hook = run(action='lower-lr', lr_scale=0.5, lr_steps=10)
  assert [e['to_step'] for e in hook.events] == [20] and hook.lowered is None
  # By hand: to 20, the rate halved for steps 20..29 (the spike at 25 is skipped by the
  # guard again, not rolled back again), then set back.
  t, data = task(), Data()
  hooks = lambda: purax.hooks.standard(log_every=10, progress=False,  # noqa: E731
                                       writer=writers.MultiWriter([]))
  manual, _ = purax.fit(t, t.init(jax.random.key(0), data[0]), data, steps=20, hooks=hooks())
  peak = float(purax.hyperparams(manual)['learning_rate'])
  manual = purax.set_hyperparams(manual, learning_rate=np.float32(peak * 0.5))
  manual, history2 = purax.fit(t, manual, data, steps=30, hooks=hooks())
  assert sum(r.get('train/spikes', 0) for r in history2) == 1
  manual = purax.set_hyperparams(manual, learning_rate=np.float32(peak))
  manual, _ = purax.fit(t, manual, data, steps=40, hooks=hooks())
  assert_equal(state, manual)


@pytest.mark.parametrize('action', ['skip-data', 'lower-lr'])
def test_rerun_and_resumes_across_the_rollback_are_bitwise_equal(tmp_path, action):
  first, _, hook = run(action=action)
  again, _, _ = run(action=action)
  assert_equal(first, again)
  # Stopped before the rollback (step 27: the ring's snapshot of step 20 comes from the
  # checkpoint), and inside the replay (call 35: step 25 after going back to 20).
  for stop_after in (27, 35):
    directory = str(tmp_path / f'{action}-{stop_after}')
    stopped, _, _ = run(action=action, directory=directory, stop_after=stop_after)
    assert int(stopped.step) == (27 if stop_after == 27 else 25)
    resumed, _, resumed_hook = run(action=action, directory=directory)
    assert resumed_hook.events == hook.events
    assert_equal(first, resumed)


def test_options_are_checked_by_name():
  for kwargs, name in (({'steps': 0}, 'spike_rollback'),
                       ({'steps': 10, 'every': 3}, 'spike_rollback'),
                       ({'steps': 10, 'action': 'rewind'}, 'spike_action'),
                       ({'steps': 10, 'lr_scale': 0.0}, 'spike_lr_scale'),
                       ({'steps': 10, 'every': 5, 'lr_steps': 7}, 'spike_lr_steps')):
    with pytest.raises(ConfigError, match=name):
      purax.hooks.SpikeRollback(**kwargs)


def test_a_log_cadence_it_cannot_follow_or_a_task_without_the_guard_is_refused():
  t, data = task(), Data()
  with pytest.raises(ConfigError, match='spike_rollback_every'):
    purax.fit(t, t.init(jax.random.key(0), data[0]), data, steps=10,
              hooks=[purax.hooks.Log(10), purax.hooks.SpikeRollback(4)])
  plain = purax.Task(model=MLP(num_classes=3, features=(8,)), 
                       tx=purax.adamw(learning_rate=1e-2, total_steps=10))
  with pytest.raises(ConfigError, match='spike guard'):
    purax.fit(plain, plain.init(jax.random.key(0), data[0]), data, steps=10,
              hooks=[purax.hooks.SpikeRollback(5)])
  with pytest.raises(ConfigError, match='random-access'):
    purax.fit(t, t.init(jax.random.key(0), data[0]), iter([data[i] for i in range(10)]),
              hooks=[purax.hooks.SpikeRollback(5)])


def test_the_event_is_in_the_checkpoint(tmp_path):
  directory = str(tmp_path / 'run')
  run(directory=directory)
  restored = purax.restore_or_init(directory, task(), jax.random.key(0), Data()[0],
                                   hooks=[purax.hooks.SpikeRollback(10, every=5)])
  extra = restored.extra
  assert extra['data']['offset'] == 10
  assert [e['step'] for e in extra['hooks']['spike_rollback']['events']] == [30]
  json.dumps(extra)


CLI = ['--model', 'mlp', '--steps', '40', '--batch-size', '32', '--log-every', '10',
       '--checkpoint-every', '10', '--no-progress', '--spike-k', '6', '--spike-window', '16',
       '--spike-rollback', '10']


def spiked_train(workdir, kill_at=0):
  """``purax train`` with batch 25 scaled by 1e3, killed at the first call
  end at or past step ``kill_at`` (0: never)."""
  import subprocess
  import sys
  from tests import helpers_runs
  return subprocess.run([sys.executable, '-m', 'tests.scripts.spike_rollback_train',
                         str(SPIKE_AT), str(kill_at), 'train', '--workdir', str(workdir),
                         *CLI], cwd=helpers_runs.ROOT, env=helpers_runs.ENV,
                        capture_output=True, text=True, timeout=300)


def test_cli_rollback_rerun_and_sigkill_resume_are_bitwise_equal(tmp_path):
  from tests import helpers_runs
  runs = {}
  for name, kill_at in (('first', 0), ('rerun', 0), ('killed', 35)):
    done = spiked_train(tmp_path / name, kill_at)
    if kill_at:   # killed at step 35 (only the replay gets there): resumed from its step 30
      assert done.returncode == -9, done.stderr[-2000:]
      done = spiked_train(tmp_path / name)
    assert done.returncode == 0, done.stderr[-2000:]
    runs[name] = helpers_runs.final_tree(tmp_path / name)
  for name in ('rerun', 'killed'):
    for x, y in zip(jax.tree.leaves(runs['first'][0]), jax.tree.leaves(runs[name][0]),
                    strict=True):
      np.testing.assert_array_equal(x, y)
    assert runs[name][1]['data'] == runs['first'][1]['data'] == {
        'next_step': 40, 'offset': 10, 'batch_size': 32}
  logs = {name: helpers_runs.logged(tmp_path / name) for name in runs}
  events = [r for r in logs['first'] if 'rollback/from_step' in r]
  assert [(r['step'], r['rollback/to_step'], r['rollback/skip_data_steps']) for r in events
          ] == [(30, 20, 10)]
  steady = lambda log: [(r['step'], r.get('train/loss'), r.get('rollback/to_step'))  # noqa: E731
                        for r in log]
  assert steady(logs['killed']) == steady(logs['rerun']) == steady(logs['first'])


def test_cli_bad_rollback_values_are_named_before_training(tmp_path):
  from tests import helpers_runs
  for flags, name in ((['--spike-rollback', '10'], 'spike_rollback'),
                      (['--spike-k', '6', '--spike-rollback', '-1'], 'spike_rollback'),
                      (['--spike-k', '6', '--spike-rollback', '10', '--spike-action', 'undo'],
                       'spike_action'),
                      (['--spike-k', '6', '--spike-rollback', '10', '--spike-lr-scale', '2'],
                       'spike_lr_scale')):
    done = helpers_runs.purax('train', '--workdir', str(tmp_path / name), '--model', 'mlp',
                              '--steps', '5', '--no-progress', *flags)
    assert done.returncode != 0 and name in done.stderr, done.stderr[-1000:]
    assert not os.path.exists(tmp_path / name / 'metrics.jsonl')


def test_a_check_adds_one_host_read_at_most_and_a_full_ring_allocates_nothing(monkeypatch):
  """The ring's cost (issue 48), as counts. Host reads: at a check on a log
  point the spike count comes from the window the log point read (the fit
  reads the host as often as without the rollback); at a check between log
  points one read, the window's. Allocations: a snapshot, once the ring is
  full, is copied into the arrays of the one it drops; the ring holds the
  arrays of its first ``slots`` snapshots only."""
  reads = []     # host reads of device arrays (a read of numpy arrays reads nothing)

  def counted(real):
    def read(x):
      if any(isinstance(y, jax.Array) for y in jax.tree.leaves(x)):
        reads.append(1)
      return real(x)
    return read
  for name in ('device_get', 'block_until_ready'):
    monkeypatch.setattr(jax, name, counted(getattr(jax, name)))
  snapshots = []     # the arrays of every snapshot taken (held: no id is reused)
  real_snapshot = purax.hooks.SpikeRollback._snapshot

  def snapshot(self, step, state):
    real_snapshot(self, step, state)
    snapshots.append(self.ring[-1][1])
  monkeypatch.setattr(purax.hooks.SpikeRollback, '_snapshot', snapshot)

  def count(*rollback):
    t, data = task(), Data(spike_at=-1)
    hooks = purax.hooks.standard(log_every=10, progress=False, writer=writers.MultiWriter([]),
                                 max_consecutive_skips=None) + list(rollback)
    state = t.init(jax.random.key(0), data[0])
    del reads[:], snapshots[:]
    purax.fit(t, state, data, steps=60, hooks=hooks, steps_per_call=1)
    return len(reads)

  alone = count()
  assert count(purax.hooks.SpikeRollback(20, every=10)) == alone   # checks at 10, ..., 50
  assert len(snapshots) == 5
  held = {id(x): x for leaves in snapshots for x in leaves}
  assert len(held) == 2 * len(snapshots[0])                      # slots = 20 // 10
  # Checks at 5, 15, ..., 55 between the log points read the window once each.
  assert count(purax.hooks.SpikeRollback(20, every=5)) == alone + 6


class TwoSpikes(Data):
  """Batches 25 and 42 scaled by 1e3; 45 batches."""

  def __init__(self):
    super().__init__(n=45)

  def __getitem__(self, i):
    batch = super().__getitem__(i)
    return dict(batch, x=batch['x'] * 1e3) if i == 42 else batch


def test_data_that_runs_out_at_the_step_rolled_back_to_ends_with_a_checkpoint(tmp_path):
  """Rolled back from 30 to 20, then from 35 to 25 (skip-data, offset 20): the
  next batch, data[25 + 20], is past the data, so the run ends at 25, where
  a checkpoint was saved before the rollback: the final save failed
  (StepAlreadyExistsError: the run 'failed', exit 2 on the command line, e.g.
  purax train --model mlp --steps 200 --batch-size 32 --spike-k 1.5
  --spike-window 8 --spike-rollback 20 --log-every 10 --checkpoint-every 10)."""
  directory = str(tmp_path / 'run')
  state, history, hook = run(data=TwoSpikes(), directory=directory)
  assert [(e['step'], e['to_step']) for e in hook.events] == [(30, 20), (35, 25)]
  assert (history.end.status, history.end.step) == ('finished', 25)
  restored = purax.restore_or_init(directory, task(), jax.random.key(0), Data()[0],
                                   hooks=[purax.hooks.SpikeRollback(10, every=5)])
  assert restored.step == 25 and restored.extra['data']['offset'] == 20   # the rolled-back run
  assert_equal(restored.state, state)


def test_a_run_resumed_past_the_step_it_then_rolls_back_to_and_ends_at_saves_that_step(
    tmp_path):
  """Stopped at step 32 (after the first rollback), resumed: rolled back from
  35 to 25 where the data runs out. The end's save skipped a step before the
  resumed one, so the run kept no checkpoint of its end (its newest: the
  stale or deleted step 25's); it saves it and equals the straight run."""
  directory = str(tmp_path / 'run')
  _, first, _ = run(data=TwoSpikes(), directory=directory, stop_after=42)
  assert first.end.status == 'stopped' and first.end.step > 25
  state, history, hook = run(data=TwoSpikes(), directory=directory)
  assert (history.end.status, history.end.step) == ('finished', 25)
  straight, _, _ = run(data=TwoSpikes(), directory=str(tmp_path / 'straight'))
  restored = purax.restore_or_init(directory, task(), jax.random.key(0), Data()[0],
                                   hooks=[purax.hooks.SpikeRollback(10, every=5)])
  assert restored.step == 25 and restored.extra['data']['offset'] == 20
  assert restored.extra['end']['status'] == 'finished'
  assert_equal(restored.state, straight)
