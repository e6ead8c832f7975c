"""`purax train --dry-run`: summary, compiled FLOPs and memory, exit 0, nothing written."""

import json
import re
import os

import pytest

from purax.app import cli


@pytest.mark.slow
def test_dry_run_prints_the_summary_and_cost_and_writes_nothing(tmp_path, capsys):
  workdir = tmp_path / 'never'
  assert cli.main(['train', '--dry-run', '--model', 'mlp', '--workdir', str(workdir)]) == 0
  out = capsys.readouterr().out
  assert not workdir.exists() and os.listdir(tmp_path) == []
  assert 'Dense_0' in out and 'total' in out and 'state per device' in out
  assert 'GFLOP' in out and 'temporaries' in out and 'nothing written' in out
  result = json.loads(out.strip().splitlines()[-1])['dry_run']
  assert result['params'] == 85_002 and result['flops'] > 0 and result['temp_bytes'] > 0


@pytest.mark.slow
def test_dry_run_on_a_mesh_counts_bytes_per_device(capsys, tmp_path):
  assert cli.main(['train', '--dry-run', '--model', 'mlp', '--mesh', 'fsdp=8',
                   '--workdir', str(tmp_path / 'x')]) == 0
  out = capsys.readouterr().out
  sharded = json.loads(out.strip().splitlines()[-1])['dry_run']
  # Issue 29.6: on a mesh the summary has a row per parameter with its
  # PartitionSpec (the same table as purax.summary): split and replicated ones.
  assert re.search(r"\nDense_0/kernel +\[64, 256\] +float32 +P\(None, 'fsdp'\) +8.00 KiB\n", out)
  assert re.search(r'\nDense_0/bias +\[256\] +float32 +P\(\) +1.00 KiB\n', out)
  assert cli.main(['train', '--dry-run', '--model', 'mlp', '--workdir', str(tmp_path / 'y')]) == 0
  out = capsys.readouterr().out
  single = json.loads(out.strip().splitlines()[-1])['dry_run']
  assert 'PartitionSpec' not in out
  assert sharded['params'] == single['params']
  assert sharded['state_bytes_per_device'] < single['state_bytes_per_device'] / 2
  assert os.listdir(tmp_path) == []


def test_dry_run_refuses_bad_input_like_train(capsys):
  assert cli.main(['train', '--dry-run', '--batch-size', '5000']) == 2
  assert 'batch_size: expected in [1, 1437]' in capsys.readouterr().err
  assert cli.main(['train', '--dry-run', '--profile', '8:5']) == 2
  assert "profile: expected START < STOP" in capsys.readouterr().err


def test_sizes_beyond_the_memory_are_refused_at_once_without_allocating(tmp_path, capsys):
  """--spike-window 1e9 (7.45 GiB of state) and a batch of 2**30 examples
  (260 GiB) are refused by name before any program compiles and anything of their size
  is allocated (the peak resident memory of this process does not grow by
  more than 1 GiB), and nothing is written."""
  import resource
  from tests.helpers import compilations
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss     # KiB
  with compilations() as compiled:
    refuse(tmp_path, capsys)
  assert compiled == []                     # refused before any program was compiled
  assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 2 ** 20
  assert os.listdir(tmp_path) == []


def refuse(tmp_path, capsys):
  """The two refusals of the test above."""
  assert cli.main(['train', '--dry-run', '--spike-k', '6', '--spike-window', str(10 ** 9),
                   '--workdir', str(tmp_path / 'a')]) == 2
  err = capsys.readouterr().err
  assert 'spike_window: expected an integer in [2, 2**24' in err and '7.45 GiB' in err, err
  assert cli.main(['train', '--dry-run', '--model', 'mlp', '--batch-size', str(2 ** 30),
                   '--workdir', str(tmp_path / 'b')]) == 2
  err = capsys.readouterr().err
  assert re.search(r'batch_size: expected a batch that fits in the [\d.]+ [MG]iB available '
                   r'.*, got 1073741824, needing 260.00 GiB \(the inputs and targets', err), err



def test_dry_run_on_a_run_directory_makes_the_resume_check_and_writes_nothing(tmp_path, capsys):
  """A dry run of a command that would resume WORKDIR refuses what the run
  would refuse (a field that changes the computation), naming the flag and
  the saved value, and leaves the directory as it was; so is a directory that
  holds no purax run."""
  from purax.app import rundir
  from purax.app.config import TrainConfig
  workdir = tmp_path / 'run'
  workdir.mkdir()
  saved = TrainConfig.of(model='mlp', learning_rate=1e-3, workdir=str(workdir)).validate().resolved()
  rundir.write_atomic(str(workdir / rundir.CONFIG), saved.to_json())
  before = (workdir / rundir.CONFIG).read_text()
  assert cli.main(['train', '--dry-run', '--workdir', str(workdir), '--learning-rate', '5e-3']) == 2
  err = capsys.readouterr().err
  assert 'learning_rate' in err and '0.001' in err and 'start a new --workdir' in err
  assert os.listdir(workdir) == [rundir.CONFIG] and (workdir / rundir.CONFIG).read_text() == before
  foreign = tmp_path / 'foreign'
  foreign.mkdir()
  (foreign / 'notes.txt').write_text('mine')
  assert cli.main(['train', '--dry-run', '--model', 'mlp', '--workdir', str(foreign)]) != 0
  assert 'workdir: expected a new or empty directory' in capsys.readouterr().err
  assert os.listdir(foreign) == ['notes.txt']


def test_dry_run_with_muon_prints_which_leaf_goes_where(tmp_path, capsys):
  """--optimizer muon --dry-run prints purax.core.muon's table: the LM's
  attention and MLP kernels on Muon (scanned: the layer axis a batch axis),
  its embedding and norms on AdamW; adamw prints no such table."""
  args = ['train', '--dry-run', '--model', 'lm', '--dataset', 'pystdlib', '--d-model', '32',
          '--num-layers', '2', '--num-heads', '4', '--seq-len', '16', '--batch-size', '4',
          '--optimizer', 'muon', '--workdir', str(tmp_path / 'x')]
  assert cli.main(args + ['--scan-layers', 'True']) == 0
  out = capsys.readouterr().out
  assert 'muon: which leaf goes where' in out
  assert re.search(r'\nlayers/attention/qkv +\[2, 32, 3, 4, 8\] +muon +red \[1\] out \[3, 4\] '
                   r'batch \[0, 2\] ', out), out
  assert re.search(r'\nlayers/mlp/wo +\[2, 128, 32\] +muon +red \[1\] out \[2\] batch \[0\] ', out)
  assert re.search(r'\nembed/embedding +\[256, 32\] +adamw +- +an embedding table', out)
  assert re.search(r'\nlayers/norm1/scale +\[2, 32\] +adamw ', out)
  assert cli.main(args[:-4] + ['--workdir', str(tmp_path / 'y')]) == 0
  assert 'which leaf goes where' not in capsys.readouterr().out
  assert os.listdir(tmp_path) == []
