"""A run directory written by purax before the loop-of-hooks redesign resumes
and ends bitwise where a run of today's code does.

``tests/fixtures/run_before_hooks`` was written by commit 6e849cd (purax
0.1.0 before the redesign): ``python -m tests.scripts.train_recorded 4 train
--model mlp --steps 8 --batch-size 32 --log-every 2 --eval-every 4
--checkpoint-every 0 --no-progress``, stopped after step 4 with its checkpoint
committed (the TensorBoard events and the lock file left out).

It was written before ``--weight-decay-mask`` (weight decay then applied to
every leaf; the default is now ``matrices``): it resumes with its own
``'all'``, recorded in its config, so it ends as a run of today's code with
``--weight-decay-mask all``, not as one with today's default."""

import json
import os
import shutil

import jax
import numpy as np

from purax.testing import Tolerance, assert_trees_close
from tests.helpers_runs import final_tree, logged, purax

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       'fixtures', 'run_before_hooks')
ARGS = ['--model', 'mlp', '--steps', '8', '--batch-size', '32', '--log-every', '2',
        '--eval-every', '4', '--checkpoint-every', '0', '--no-progress']


def test_a_run_written_before_the_redesign_resumes_and_ends_as_a_straight_run(tmp_path):
  old = str(tmp_path / 'old')
  shutil.copytree(FIXTURE, old)
  # At XLA's default -O level, as the fixture was written (the suite's -O0
  # rounds differently).
  resumed = purax('train', '--workdir', old, xla_flags='')
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert 'from step 4' in resumed.stderr
  with open(os.path.join(old, 'config.json')) as f:
    assert json.load(f)['optimizer']['weight_decay_mask'] == 'all'   # recorded on resume
  straight = purax('train', *ARGS, '--weight-decay-mask', 'all', '--workdir',
                   str(tmp_path / 'new'), xla_flags='')
  assert straight.returncode == 0, straight.stderr[-3000:]
  (a, _, step_a), (b, _, step_b) = final_tree(old), final_tree(str(tmp_path / 'new'))
  assert step_a == step_b == 8
  # Not bitwise: the fixture's first 4 steps ran on the CPU that wrote it, and
  # XLA:CPU compiles for the host's instruction set (FMA contraction differs
  # between, e.g., Intel and AMD hosts: a few ulps, 3e-9 here). Bitwise resume
  # on one host is tests/test_resume.py's.
  assert_trees_close(a, b, Tolerance(rtol=1e-6, atol=1e-8), what='the resumed old run')


# -- a run written before the guards' state moved into TrainState.guards (0.3) ----

GUARDED = os.path.join(os.path.dirname(FIXTURE), 'run_before_guards')
GUARDED_ARGS = ['--model', 'tests.scripts.tiny_mlp:mlp', '--steps', '8', '--batch-size', '32',
                '--log-every', '2', '--eval-every', '0', '--checkpoint-every', '0',
                '--no-progress', '--precision', 'fp16', '--spike-k', '3', '--spike-window', '4']
"""``tests/fixtures/run_before_guards`` was written by commit 248594e (its
``TrainState`` with fields ``loss_scale`` and ``spike_window``), under the
suite's XLA flags: ``python -m tests.scripts.train_recorded 4 train`` with
``GUARDED_ARGS``, stopped after step 4 with its checkpoint committed (the
TensorBoard events, the lock file and batches.txt left out): float16 with a
loss scale, and the spike guard's window filled."""


def _stored(workdir, step):
  """The arrays checkpoint ``step`` holds, by their stored paths, read without a target."""
  import orbax.checkpoint as ocp
  with ocp.PyTreeCheckpointer() as reader:
    return reader.restore(os.path.join(workdir, 'checkpoints', str(step), 'state'))


def test_a_checkpoint_written_before_the_guards_moved_restores_bitwise_into_guards():
  tree, _, step = final_tree(GUARDED)
  stored = _stored(GUARDED, 4)['state']
  state = tree['state']
  assert step == 4 and sorted(state.guards) == ['loss_scale', 'spikes']
  pairs = [(state.guards['loss_scale'].scale, stored['loss_scale']['scale']),
           (state.guards['loss_scale'].good_steps, stored['loss_scale']['good_steps']),
           (state.guards['spikes'].values, stored['spike_window']['values']),
           (state.guards['spikes'].size, stored['spike_window']['size']),
           (state.guards['spikes'].index, stored['spike_window']['index']),
           (state.params, stored['params']), (state.opt_state.count, stored['opt_state']['count'])]
  for now, then in pairs:
    assert jax.tree.structure(now) == jax.tree.structure(then)
    for a, b in zip(jax.tree.leaves(now), jax.tree.leaves(then)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(state.guards['spikes'].size) == 4     # a window with history to resume


def test_a_run_written_before_the_guards_moved_resumes_and_ends_as_a_straight_run(tmp_path):
  old = str(tmp_path / 'old')
  shutil.copytree(GUARDED, old)
  resumed = purax('train', '--workdir', old)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert 'from step 4' in resumed.stderr
  straight = purax('train', *GUARDED_ARGS, '--workdir', str(tmp_path / 'new'))
  assert straight.returncode == 0, straight.stderr[-3000:]
  (a, _, step_a), (b, _, step_b) = final_tree(old), final_tree(str(tmp_path / 'new'))
  assert step_a == step_b == 8
  assert jax.tree.structure(a) == jax.tree.structure(b)
  # Bitwise on the host that wrote the fixture (checked when it was written);
  # elsewhere its first 4 steps carry that host's FMA contraction (see above).
  assert_trees_close(a, b, Tolerance(rtol=1e-6, atol=1e-8), what='the resumed guarded run')
  spikes = [r.get('train/spikes') for r in logged(old)]
  assert spikes == [r.get('train/spikes') for r in logged(str(tmp_path / 'new'))]
