"""purax.io.safe_files: a run directory's files are never written or read through
a link, and a link under a run directory never leads out of it (issue 28.1)."""

import os

import pytest

from purax.core.errors import ConfigError
from purax.io import safe_files


@pytest.fixture
def victim(tmp_path):
  """A file outside the run directory that nothing may write."""
  path = tmp_path / 'outside' / 'victim'
  path.parent.mkdir()
  path.write_text('precious')
  return path


def test_write_atomic_replaces_a_link_and_never_writes_through_its_temporary(tmp_path, victim):
  run = tmp_path / 'run'
  run.mkdir()
  (run / 'config.json').symlink_to(victim)
  (run / 'config.json.tmp').symlink_to(victim)   # planted where the temporary goes
  safe_files.write_atomic(str(run / 'config.json'), '{"steps": 4}')
  assert victim.read_text() == 'precious'
  assert not (run / 'config.json').is_symlink()
  assert (run / 'config.json').read_text() == '{"steps": 4}'
  assert not os.path.lexists(run / 'config.json.tmp')


@pytest.mark.parametrize('kind, what', [('symlink', 'a symlink to .*victim'),
                                        ('dangling symlink', "a symlink to '.*gone'"),
                                        ('fifo', 'a FIFO, socket or device'),
                                        ('directory', 'a directory')])
def test_open_file_refuses_anything_but_a_regular_file_naming_it(tmp_path, victim, kind, what):
  path = tmp_path / 'metrics.jsonl'
  if kind == 'symlink':
    path.symlink_to(victim)
  elif kind == 'dangling symlink':
    path.symlink_to(tmp_path / 'outside' / 'gone')
  elif kind == 'fifo':
    os.mkfifo(path)            # opened without O_NONBLOCK, a write would hang here
  else:
    path.mkdir()
  for mode in ('r', 'a', 'w', 'x'):
    with pytest.raises(ConfigError, match=rf'metrics\.jsonl: expected a regular file .*got {what}'):
      safe_files.open_file(str(path), mode)
  assert victim.read_text() == 'precious'
  assert not (tmp_path / 'outside' / 'gone').exists()


def test_links_under_a_run_directory_may_not_lead_out_of_it(tmp_path, victim):
  real = tmp_path / 'real'
  (real / 'checkpoints' / '2').mkdir(parents=True)
  (real / 'checkpoints' / '4').symlink_to('2')            # inside: allowed
  run = tmp_path / 'run'
  run.symlink_to(real)                                    # the run directory itself: the user's
  safe_files.check_no_links_out(str(run))
  (real / 'checkpoints' / '2' / 'extra').symlink_to(victim.parent)
  with pytest.raises(ConfigError, match=r'checkpoints/2/extra: expected a file or directory '
                                        r'inside the run directory .*run, got a symlink to '
                                        r"'.*outside', outside it"):
    safe_files.check_no_links_out(str(run))
