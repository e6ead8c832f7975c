"""purax.io.checkpoint.integrity.is_io_error: a file-system or format error
is recognised however it was chained: raised from it (``__cause__``), raised
while handling it (``__context__``, implicit), or at any depth."""

import json

from purax.io.checkpoint import integrity


def raised(make):
  try:
    make()
  except BaseException as e:     # pylint: disable=broad-except
    return e
  raise AssertionError('nothing raised')


def io_failure():
  open('/nonexistent/purax/checkpoint/_METADATA')     # FileNotFoundError


def implicitly(inner):
  def make():
    try:
      inner()
    except BaseException:        # pylint: disable=broad-except
      raise RuntimeError('restoring the checkpoint failed')   # __context__, no __cause__
  return make


def explicitly(inner):
  def make():
    try:
      inner()
    except BaseException as e:   # pylint: disable=broad-except
      raise RuntimeError('restoring the checkpoint failed') from e
  return make


def test_an_io_error_is_recognised_through_implicit_and_explicit_chains():
  implicit = raised(implicitly(io_failure))
  assert implicit.__cause__ is None and isinstance(implicit.__context__, OSError)
  assert integrity.is_io_error(implicit)
  assert integrity.is_io_error(raised(explicitly(io_failure)))
  assert integrity.is_io_error(raised(implicitly(implicitly(explicitly(io_failure)))))
  decode = raised(implicitly(lambda: json.loads('{"step": ')))
  assert integrity.is_io_error(decode)
  store = raised(implicitly(lambda: (_ for _ in ()).throw(ValueError('DATA_LOSS: chunk'))))
  assert integrity.is_io_error(store)


def test_other_errors_are_not_io_errors():
  assert not integrity.is_io_error(raised(implicitly(lambda: 1 / 0)))
  assert not integrity.is_io_error(RuntimeError('no chain'))
  cycle = RuntimeError('a')
  cycle.__context__ = KeyError('b')
  cycle.__context__.__context__ = cycle            # a cycle ends the walk
  assert not integrity.is_io_error(cycle)
