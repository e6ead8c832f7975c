"""``purax sweep --from RUN[:STEP]``: a population branched from one run's checkpoint.

Member ``i`` equals the parent resumed alone (``purax train`` on a copy of its
directory, trained on to the sweep's ``--steps``) bitwise on the CPU; a fork
killed by SIGKILL resumes with the same command bitwise; bad input is named
before anything trains."""

import json
import os
import re
import shutil

import jax
import numpy as np
import pytest

from purax.app import cli
from purax.core.errors import ConfigError
from purax.io.checkpoint import Checkpointer
from tests.helpers import assert_bitwise
from tests.helpers_runs import final_tree, purax

pytestmark = pytest.mark.slow

PARENT = ['--model', 'mlp', '--steps', '10', '--batch-size', '32', '--log-every', '5',
          '--eval-every', '0', '--checkpoint-every', '5', '--learning-rate', '0.002',
          '--no-progress']
# Member 0 continues the parent's rate; member 1 barely moves (so member 0 is the best).
FORK = ['--lr', '0.002,1e-6', '--wd', '1e-4,1e-2', '--steps', '30', '--log-every', '5',
        '--eval-every', '10', '--no-progress']


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """The parent (10 steps, checkpoints 5 and 10) and a fork of it trained straight."""
  d = tmp_path_factory.mktemp('fork')
  done = purax('train', *PARENT, '--workdir', d / 'parent')
  assert done.returncode == 0, done.stderr[-3000:]
  done = purax('sweep', '--from', d / 'parent', *FORK, '--workdir', d / 'straight')
  assert done.returncode == 0, done.stderr[-3000:]
  return d


def test_member_equals_the_parent_resumed_alone_bitwise_and_the_lineage_is_recorded(runs):
  alone = runs / 'alone'
  shutil.copytree(runs / 'parent', alone)
  done = purax('train', '--workdir', alone, '--steps', '30', '--no-progress')
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads((runs / 'straight' / 'sweep.json').read_text())
  assert summary['members'][0]['member'] == 0          # the best: saved in best/
  (want, _, want_step), (got, _, got_step) = (final_tree(str(d))
                                              for d in (alone, runs / 'straight' / 'best'))
  assert want_step == got_step == 30
  assert_bitwise(got['state'], want['state'], 'member 0')
  lineage = json.loads((runs / 'straight' / 'lineage.json').read_text())
  with Checkpointer(str(runs / 'parent' / 'checkpoints'), read_only=True) as ckpt:
    sha = ckpt.read_extra(10)['sha256']
  assert (lineage['parent'], lineage['step'], lineage['checkpoint_sha256']) == (
      str(runs / 'parent'), 10, sha)
  assert lineage['parent_config']['learning_rate'] == 0.002
  config = json.loads((runs / 'straight' / 'sweep_config.json').read_text())
  assert config['parent'] == str(runs / 'parent')
  assert config['warmup_steps'] == 50      # the parent's (the sweep's default is 20)


def test_a_fork_from_an_older_kept_step_branches_there(runs):
  done = purax('sweep', '--from', f'{runs / "parent"}:5', *FORK, '--steps', '12',
               '--workdir', runs / 'at5')
  assert done.returncode == 0, done.stderr[-3000:]
  assert json.loads((runs / 'at5' / 'lineage.json').read_text())['step'] == 5
  history = [json.loads(line) for line in open(runs / 'at5' / 'history.jsonl')]
  assert [r['step'] for r in history if 'train/loss' in r][0] == 10   # 5 steps after 5


def test_a_fork_killed_by_sigkill_resumes_with_the_same_command_bitwise(runs):
  from tests.helpers_signals import signal_at
  killed = runs / 'killed'
  args = ['sweep', '--from', runs / 'parent', *FORK, '--workdir', killed]
  # Before the 17th call (step 27): checkpoints every 5 steps, 20 committed by then
  # (a save waits for the one before), 25 perhaps.
  done = signal_at('step:17', 'SIGKILL', *args)
  assert done.returncode == -9, done.stderr[-3000:]
  assert not (killed / 'sweep.json').exists()
  done = purax(*args)
  assert done.returncode == 0, done.stderr[-3000:]
  assert re.search(f'resuming sweep {killed} from step (20|25)', done.stderr), done.stderr
  want, got = (json.loads((d / 'sweep.json').read_text()) for d in (runs / 'straight', killed))
  assert got['members'] == want['members']
  (a, _, _), (b, _, _) = (final_tree(str(d / 'best')) for d in (runs / 'straight', killed))
  assert_bitwise(b['state'], a['state'], 'best member')
  assert json.loads((killed / 'lineage.json').read_text()) == json.loads(
      (runs / 'straight' / 'lineage.json').read_text())


@pytest.mark.parametrize('args, message', [
    (['--from', '{d}/nowhere'], "--from: expected a purax train run directory (with "
     "config.json), got '{d}/nowhere'"),
    (['--from', '{d}/parent:7'], '--from: expected a step the run keeps, one of [5, 10], '
     "got '{d}/parent:7' (step 7)"),
    (['--from', '{d}/parent', '--model', 'cnn'], "model: expected 'mlp', the parent run's value"),
    (['--from', '{d}/parent', '--batch-size', '16'], "batch_size: expected 32, the parent run's"),
    (['--from', '{d}/parent', '--optimizer', 'sgd'], "optimizer: expected 'adamw', the parent"),
    (['--from', '{d}/parent', '--seeds', '1'], "seeds: expected '0', the parent run's seed"),
    (['--from', '{d}/parent', '--momentum', '0.9,0.8'], 'momentum: expected unset for '
     '--optimizer adamw'),
    (['--from', '{d}/parent', '--steps', '10'], 'steps: expected > 10, the branch point'),
])
def test_bad_input_is_named_before_anything_trains(runs, capsys, args, message):
  workdir = runs / 'bad'
  rc = cli.main(['sweep', *[a.format(d=runs) for a in args], '--workdir', str(workdir),
                 '--no-progress'])
  assert rc == 2
  assert message.format(d=runs) in capsys.readouterr().err
  assert not workdir.exists()


def test_a_fork_resumed_after_its_parent_trained_on_branches_from_the_recorded_step(runs):
  """Killed before its first checkpoint, while the parent goes on (a newer
  newest checkpoint): the same ``--from RUN`` resumes from the step it recorded,
  and ends bitwise as the straight fork; a checkpoint replaced is refused."""
  from tests.helpers_signals import signal_at
  parent, fork = runs / 'moving', runs / 'moving-fork'
  shutil.copytree(runs / 'parent', parent)
  args = ['sweep', '--from', parent, *FORK, '--workdir', fork]
  done = signal_at('step:2', 'SIGKILL', *args)
  assert done.returncode == -9, done.stderr[-3000:]
  assert (fork / 'lineage.json').exists() and not (fork / 'checkpoints' / '15').exists()
  done = purax('train', '--workdir', parent, '--steps', '15', '--no-progress')
  assert done.returncode == 0, done.stderr[-3000:]      # it keeps 10 and 15 (its newest)
  done = purax(*args)
  assert done.returncode == 0, done.stderr[-3000:]
  (a, _, _), (b, _, _) = (final_tree(str(d / 'best')) for d in (runs / 'straight', fork))
  assert_bitwise(b['state'], a['state'], 'best member')
  assert json.loads((fork / 'lineage.json').read_text())['step'] == 10


def _inherit(parent_options, sweep_options, step=200):
  """``fork.inherit`` of a sweep config from a parent's config (nothing trained)."""
  from purax.app import fork as fork_lib
  from purax.app.config import TrainConfig
  from purax.app.sweep_config import SweepConfig
  parent = fork_lib.Parent('/runs/parent', step, TrainConfig.of(
      model='mlp', steps=step, **parent_options), 'sha')
  return fork_lib.inherit(SweepConfig.of(model='mlp', steps=600, **sweep_options), parent)


def test_a_cooldown_fork_of_a_wsd_parent_starts_its_cooldowns_at_the_branch_point():
  """Issue 48.1: ``--cooldown-steps 50,100,200,400`` of a WSD parent: the
  members' cooldowns start at the branch step unless --decay-start says
  otherwise; a cosine parent is refused by name."""
  wsd = dict(schedule='wsd', decay_start=1000.0, cooldown_steps=100.0)
  config = _inherit(wsd, dict(cooldown_steps='50,100,200,400')).validate()
  specs = config.specs()
  assert specs['decay_start'] == (200.0,)
  assert specs['cooldown_steps'] == (50.0, 100.0, 200.0, 400.0)
  assert config.population_size()[0] == 4
  assert _inherit(wsd, dict(decay_start='300')).specs() == {
      **specs, 'decay_start': (300.0,), 'cooldown_steps': (100.0,)}
  with pytest.raises(ConfigError, match=r"^schedule: expected 'default', the parent "
                                            r"run's value"):
    _inherit({}, dict(schedule='wsd', cooldown_steps='50,100'))


@pytest.mark.parametrize('text, got', [
    (b'{"step": 10, "checkpoint_sha', 'unreadable text'),          # cut short
    (b'\xff\xfe', 'bytes that are not UTF-8'),
    (b'[1, 2]', 'list'),
    (b'{"step": "abc", "checkpoint_sha256": "x"}', "{'step': 'abc'"),
    (b'{"checkpoint_sha256": "x"}', "{'checkpoint_sha256': 'x'}"),
])
def test_a_damaged_lineage_is_a_named_error_not_a_traceback(tmp_path, text, got):
  """A resumed fork reads lineage.json for its branch point: truncated,
  not UTF-8, not an object, without an integer step (a JSONDecodeError,
  TypeError, ValueError, UnicodeDecodeError traceback before)."""
  from purax.app import fork as fork_lib
  (tmp_path / 'lineage.json').write_bytes(text)
  with pytest.raises(ConfigError, match=r'^lineage.json: expected the lineage this fork '
                                        r'recorded when it started .*, got .*' + re.escape(got)):
    fork_lib.recorded(str(tmp_path))


def test_a_fork_without_its_lineage_writes_it_when_new_and_refuses_to_guess_it_later(runs,
                                                                                  capsys):
  """Killed after sweep_config.json, before lineage.json: the same command
  trained the fork to its end without ever writing its lineage; removed from a
  fork with checkpoints, the lineage (its branch point) cannot be told again."""
  fork = runs / 'unrecorded'
  fork.mkdir()
  shutil.copy(runs / 'straight' / 'sweep_config.json', fork)
  done = purax('sweep', '--from', runs / 'parent', *FORK, '--workdir', fork)
  assert done.returncode == 0, done.stderr[-3000:]
  assert (json.loads((fork / 'lineage.json').read_text())
          == json.loads((runs / 'straight' / 'lineage.json').read_text()))
  (fork / 'lineage.json').unlink()
  shutil.rmtree(fork / 'best')
  (fork / 'sweep.json').unlink()          # a stopped fork, its lineage removed
  rc = cli.main(['sweep', '--from', str(runs / 'parent'), *FORK, '--workdir', str(fork)])
  assert rc == 2
  assert ("lineage.json: expected the lineage this fork recorded when it started "
          in capsys.readouterr().err)
  assert not (fork / 'lineage.json').exists()


def test_a_fork_of_a_training_run_whose_newest_checkpoint_goes_meanwhile_takes_the_next(
    runs, monkeypatch):
  """``--from RUN`` beside the training run: its newest checkpoint, deleted by
  the run's --keep-last as the fork reads it, was a CheckpointError (exit 2,
  'checkpoint 60 ... not found', seen with a cnn saving every 10 steps);
  the fork now takes the run's newest again."""
  from purax.io.checkpoint import Checkpointer as Ckpt
  racing = runs / 'racing'
  shutil.copytree(runs / 'parent', racing)
  real, deleted = Ckpt.restore, []

  def restore(self, abstract, step=None, **kwargs):
    if not deleted and str(racing) in str(self.directory):   # the run saved twice since
      deleted.append(step)
      shutil.rmtree(os.path.join(self.directory, str(step)))
    return real(self, abstract, step, **kwargs)

  monkeypatch.setattr(Ckpt, 'restore', restore)
  rc = cli.main(['sweep', '--from', str(racing), *FORK, '--workdir', str(runs / 'raced')])
  assert rc == 0 and deleted == [10]
  assert json.loads((runs / 'raced' / 'lineage.json').read_text())['step'] == 5


def test_a_parent_whose_rollbacks_skipped_data_is_refused_by_name(runs, monkeypatch):
  """A parent of --spike-rollback --spike-action skip-data reads step s's batch
  at data[s + offset]; the fork read data[s] on (offset dropped: the parent's
  own batches again, not its continuation), exit 0. Refused by name."""
  from purax.app import fork as fork_lib
  from purax.io.checkpoint import Checkpointer as Ckpt
  real = Ckpt.restore

  def restore(self, abstract, step=None, **kwargs):     # the checkpoint of a rolled-back run
    tree, extra, at = real(self, abstract, step, **kwargs)
    return tree, dict(extra, data=dict(extra['data'], offset=350)), at

  monkeypatch.setattr(Ckpt, 'restore', restore)
  with pytest.raises(ConfigError, match=r'^--from: expected a run whose data position skips '
                                        r'no steps \(offset 0: a fork reads the batches of its '
                                        r'steps\), got .*parent.* step 10 at data offset 350'):
    fork_lib.open_parent(str(runs / 'parent'))


def test_a_run_directory_whose_name_ends_in_colon_digits_is_the_run_not_a_step(tmp_path):
  """``--from runs/exp:12`` of a directory named so: the run (it was read as
  ``runs/exp`` at step 12, a missing run); ``RUN:STEP`` of another run still splits."""
  from purax.app import fork as fork_lib
  (tmp_path / 'exp:12').mkdir()
  assert fork_lib.parse_from(str(tmp_path / 'exp:12')) == (str(tmp_path / 'exp:12'), None)
  assert fork_lib.parse_from(str(tmp_path / 'exp:12') + ':5') == (str(tmp_path / 'exp:12'), 5)
  assert fork_lib.parse_from(str(tmp_path / 'other:7')) == (str(tmp_path / 'other'), 7)


def test_a_fork_of_a_parent_with_spike_rollback_keeps_its_guard_but_not_its_rollback():
  """A population has no rollback (purax.app.config.refuse_rollback): the
  parent's --spike-rollback and what it does are a run's, not inherited (the
  fork was refused by its own inherited option); the spike guard is."""
  config = _inherit(dict(spike_k=6.0, spike_rollback=20, spike_action='lower-lr',
                         spike_lr_scale=0.5, spike_lr_steps=40), {}).validate()
  opt = config.optimizer
  assert (opt.spike_k, opt.spike_rollback, opt.spike_action, opt.spike_lr_scale,
          opt.spike_lr_steps) == (6.0, 0, 'skip-data', 0.1, 0)
  with pytest.raises(ConfigError, match=r'^spike_rollback: expected 0 for a population'):
    _inherit(dict(spike_k=6.0), dict(spike_rollback=20)).validate()


@pytest.mark.parametrize('options, end', [
    (dict(cooldown_steps='50,500'), r'700 \(--decay-start 200 \+ --cooldown-steps 500'),
    (dict(decay_start='1e9'), r'1000000100 \(--decay-start 1000000000 \+ --cooldown-steps '
                              r'100'),
    (dict(decay_start='250', cooldown_steps='loguniform:10:400', members=2),
     r'650 \(--decay-start 250 \+ --cooldown-steps 400'),
])
def test_a_cooldown_fork_whose_steps_end_before_its_longest_cooldown_is_refused(options, end):
  """The guide: ``--steps`` must reach the longest cooldown's end. A fork of
  ``--cooldown-steps 10,500 --steps 80`` trained (exit 0), its long member cut
  in mid-cooldown, compared with finished ones."""
  wsd = dict(schedule='wsd', decay_start=1000.0, cooldown_steps=100.0)
  with pytest.raises(ConfigError, match=r'^steps: expected at least ' + end
                     + r"; the members' cooldowns end there\), got 600$"):
    _inherit(wsd, options)
  _inherit(wsd, dict(cooldown_steps='50,400')).validate()    # ends at 600: fine


def test_a_wsd_sweep_without_a_parent_derives_what_is_unset_and_names_what_it_cannot():
  """Unset --decay-start / --cooldown-steps: the last 20% of --steps; an unset
  decay start with several cooldowns is ambiguous: refused by name."""
  from purax.app.sweep_config import SweepConfig
  specs = SweepConfig.of(steps=100, schedule='wsd').validate().specs()
  assert (specs['decay_start'], specs['cooldown_steps']) == ((80.0,), (20.0,))
  specs = SweepConfig.of(steps=100, schedule='wsd', cooldown_steps='10').validate().specs()
  assert (specs['decay_start'], specs['cooldown_steps']) == ((90.0,), (10.0,))
  with pytest.raises(ConfigError, match=r'^decay_start: expected given when --cooldown-steps '
                                        r'varies'):
    SweepConfig.of(steps=100, schedule='wsd', cooldown_steps='10,20').validate()
  with pytest.raises(ConfigError, match=r'^cooldown_steps: expected unset for --optimizer adamw'):
    SweepConfig.of(cooldown_steps='10,20').validate()


def test_the_best_member_of_a_cli_cooldown_fork_equals_the_parent_resumed_with_its_cooldown(
    tmp_path):
  """Issue 48.1 through the command line: a WSD parent (its cooldown after its
  end), forked at step 10 into cooldowns of 20 and 5 steps; the best member
  equals ``purax train`` resuming a parent of that cooldown to the same step,
  bitwise (a parent's cooldown does not touch its first 10 steps)."""
  wsd = ['--schedule', 'wsd', '--decay-start', '10']
  for cooldown in ('20', '5'):
    done = purax('train', *PARENT, *wsd, '--cooldown-steps', cooldown,
                 '--workdir', tmp_path / f'parent{cooldown}')
    assert done.returncode == 0, done.stderr[-3000:]
  done = purax('sweep', '--from', tmp_path / 'parent20', '--cooldown-steps', '20,5',
               '--steps', '30', '--log-every', '5', '--eval-every', '0', '--no-progress',
               '--workdir', tmp_path / 'fork')
  assert done.returncode == 0, done.stderr[-3000:]
  best = json.loads((tmp_path / 'fork' / 'sweep.json').read_text())['members'][0]
  assert best['decay_start'] == 10.0
  cooldown = int(best['cooldown_steps'])
  alone = tmp_path / 'alone'
  shutil.copytree(tmp_path / f'parent{cooldown}', alone)
  done = purax('train', '--workdir', alone, '--steps', '30', '--no-progress')
  assert done.returncode == 0, done.stderr[-3000:]
  (want, _, want_step), (got, _, got_step) = (final_tree(str(d))
                                              for d in (alone, tmp_path / 'fork' / 'best'))
  assert want_step == got_step == 30
  assert_bitwise(got['state'], want['state'], f'the member of cooldown {cooldown}')


def test_a_fork_of_a_parent_whose_decay_spans_decay_steps_continues_that_schedule():
  """A parent whose cosine spans --decay-steps (a budget's planned schedule,
  purax.app.calibrate): a sweep's spans its --steps, so the fork (member i ==
  the parent resumed alone) needs --steps equal to it; a WSD fork has its own."""
  with pytest.raises(ConfigError, match=r"^steps: expected 400, the parent run's "
                                            r"--decay-steps .*, got 600$"):
    _inherit(dict(decay_steps=400), {})
  assert _inherit(dict(decay_steps=600), {}).run.steps == 600
  wsd = dict(schedule='wsd', decay_start=1000.0, cooldown_steps=100.0, decay_steps=400)
  assert _inherit(wsd, dict(cooldown_steps='50,100')).specs()['cooldown_steps'] == (50.0, 100.0)
