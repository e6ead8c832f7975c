"""A reader beside a writer reads a run again when the checkpoint it chose
vanished (purax.app.runs._vanished): the FileNotFoundError is found however
it was chained, implicitly (``__context__``) or explicitly (``__cause__``)."""

from purax.app import runs


def chained(inner, explicit):
  try:
    try:
      inner()
    except BaseException as e:   # pylint: disable=broad-except
      if explicit:
        raise RuntimeError('reading the run failed') from e
      raise RuntimeError('reading the run failed')        # __context__ only
  except RuntimeError as e:
    return e
  raise AssertionError('nothing raised')


def missing():
  open('/nonexistent/purax/run/checkpoints/4/_METADATA')


def test_a_missing_file_is_found_through_implicit_and_explicit_chains():
  implicit = chained(missing, explicit=False)
  assert implicit.__cause__ is None and isinstance(implicit.__context__, FileNotFoundError)
  assert runs._vanished(implicit)               # pylint: disable=protected-access
  assert runs._vanished(chained(missing, explicit=True))
  assert not runs._vanished(chained(lambda: 1 / 0, explicit=False))
