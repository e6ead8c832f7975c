"""The directory of a ``purax sweep`` or ``purax tune lr``
(purax.app.jobdir.JobDir): a directory that is not empty and is no job's of the
same command is refused before any work, and left as it was."""

import os

from purax.app import cli


def test_tune_lr_refuses_a_foreign_directory_before_any_work(tmp_path, capsys):
  (tmp_path / 'taken').mkdir()
  (tmp_path / 'taken' / 'notes.txt').write_text('mine')
  assert cli.main(['tune', 'lr', '--workdir', str(tmp_path / 'taken')]) == 2
  assert ('workdir: expected a new or empty directory, or a purax range test directory to '
          "resume (with tune_config.json), got") in capsys.readouterr().err
  assert os.listdir(tmp_path / 'taken') == ['notes.txt']
  assert os.listdir(tmp_path) == ['taken']
