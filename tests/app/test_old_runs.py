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

from purax.testing import Tolerance, assert_trees_close
from tests.helpers_runs import final_tree, purax

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
