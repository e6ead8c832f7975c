"""purax.io.progress: the log-point lines are records of the `purax` logger,
printed plain where logging is not configured for them, silenced or routed by
the logging module otherwise (issue 29.2). A script's own process is the real
case (tests/test_output.py); here pytest's handlers, which it attaches to
every non-propagating logger, are taken off the `purax` logger for the test."""

import io
import logging

import pytest

from purax.io import progress, writers


@pytest.fixture
def purax_logger():
  """The `purax` logger without pytest's handlers (taken off in the test's own
  phase: pytest attaches them again for each); levels and handlers restored."""
  logger, root = logging.getLogger('purax'), logging.getLogger()
  saved = logger.level, list(logger.handlers), root.level, list(root.handlers)

  def bare():
    logger.handlers[:] = [h for h in logger.handlers if isinstance(h, progress._Fallback)]
    root.handlers[:] = []
    return logger
  yield bare
  logger.level, logger.handlers[:], root.level, root.handlers[:] = (
      saved[0], saved[1], saved[2], saved[3])


def write():
  writers.ConsoleWriter().write_scalars(3, {'train/loss': 0.25, 'train/skipped': 0.0})


def test_a_line_is_printed_plain_on_stdout_where_logging_is_not_configured(purax_logger,
                                                                            capsys):
  purax_logger()
  assert logging.getLogger().level > logging.INFO          # as in a plain script
  write()
  assert capsys.readouterr().out == '[step 3] train/loss=0.25\n'


def test_the_logging_module_silences_or_routes_the_lines(purax_logger, capsys):
  purax_logger = purax_logger()
  purax_logger.setLevel(logging.WARNING)                 # silenced
  write()
  assert capsys.readouterr().out == ''
  purax_logger.setLevel(logging.INFO)
  routed = io.StringIO()
  purax_logger.addHandler(logging.StreamHandler(routed))   # a handler of one's own
  write()
  assert routed.getvalue() == '[step 3] train/loss=0.25\n'
  assert capsys.readouterr().out == ''                    # not printed a second time
  purax_logger.handlers.pop()
  root, to_root = logging.getLogger(), io.StringIO()
  root.addHandler(logging.StreamHandler(to_root))
  write()                                                 # root at WARNING: printed, not sent
  assert to_root.getvalue() == '' and capsys.readouterr().out == '[step 3] train/loss=0.25\n'
  root.setLevel(logging.INFO)                             # logging.basicConfig(level=INFO)
  write()
  assert to_root.getvalue() == '[step 3] train/loss=0.25\n'
  assert capsys.readouterr().out == ''


def test_a_child_loggers_records_reach_the_root_as_propagation_would(purax_logger):
  purax_logger()
  root, to_root = logging.getLogger(), io.StringIO()
  root.addHandler(logging.StreamHandler(to_root))
  child = logging.getLogger('purax.checkpoint')
  level, child.level = child.level, logging.DEBUG
  try:
    child.debug('orbax: details')
  finally:
    child.setLevel(level)
  assert to_root.getvalue() == 'orbax: details\n'


def test_bar_is_a_null_bar_without_a_terminal():
  assert isinstance(progress.bar(10, stream=io.StringIO()), progress.NullBar)
