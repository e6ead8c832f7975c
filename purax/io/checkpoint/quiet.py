"""Keeps orbax's own reports of a failure off stderr, where purax reports it once.

A failed checkpoint read or write is re-raised by :class:`Checkpointer` as one
:class:`CheckpointError` naming the step and the cause (or, for an unreadable
checkpoint that restore skips, one warning). Around it orbax made noise of its
own (issue 28.8):

* Its ``run_sync`` runs a coroutine in a fresh event loop and closes the loop
  as soon as the coroutine raises, leaving the coroutine's sibling tasks (the
  other arrays' reads or writes) pending: TensorStore then calls back into the
  closed loop (``RuntimeError: Event loop is closed`` tracebacks, one per
  array) and the abandoned coroutines die at a later garbage collection
  ("Exception ignored in: <coroutine ...>"). :func:`install` makes the loop
  await those tasks before it closes (cancelling only what outlasts
  :data:`DRAIN_S`): a cancelled task's TensorStore operation still ends, and
  calls back, later.
* Its threads log each background failure at ERROR with a traceback (four for
  one full disk), some of them after the error was raised and the
  Checkpointer closed. From the first Checkpointer on (:func:`divert_errors`),
  orbax's ERROR records go to the ``purax.checkpoint`` logger at DEBUG instead
  (with their tracebacks: ``logging.getLogger('purax.checkpoint').setLevel(
  'DEBUG')`` shows them): each is a failure that orbax raises, and purax
  re-raises named.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading

import orbax.checkpoint

#: The logger orbax's diverted ERROR records go to, at DEBUG.
DETAILS = logging.getLogger('purax.checkpoint')
_ORBAX_DIR = os.path.dirname(os.path.abspath(orbax.checkpoint.__file__)) + os.sep
_lock = threading.Lock()

#: Seconds a failed read or write's sibling tasks get to end before they are
#: cancelled and the loop closes.
DRAIN_S = 60.0


def _run_sync_via_new_loop(coro):
  """orbax's ``asyncio_utils._run_sync_via_new_loop`` that, when ``coro`` ends,
  cancels the loop's remaining tasks and awaits them before closing the loop
  (their errors, the consequences of the one raised, are dropped)."""
  loop = asyncio.new_event_loop()
  try:
    asyncio.set_event_loop(loop)
    return loop.run_until_complete(coro)
  finally:
    try:
      # The siblings' TensorStore reads and writes run on in TensorStore's
      # threads whatever becomes of their tasks, and call back into this loop
      # when they end: let them end (a failed save's writes fail fast) before
      # the loop closes; only what outlasts DRAIN_S is cancelled.
      pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
      if pending:
        _, late = loop.run_until_complete(asyncio.wait(pending, timeout=DRAIN_S))
        for task in late:
          task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
      loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
      asyncio.set_event_loop(None)
      loop.close()


def install() -> None:
  """Replaces orbax's loop runner by ``_run_sync_via_new_loop`` (idempotent;
  nothing when this orbax has no such function)."""
  from orbax.checkpoint._src import asyncio_utils
  if callable(getattr(asyncio_utils, '_run_sync_via_new_loop', None)):
    asyncio_utils._run_sync_via_new_loop = _run_sync_via_new_loop


def _READ_ONLY_NOTICE(message: str) -> bool:
  """orbax's warnings that say what was asked or expected: a reader's manager
  is read-only; a save being written has no metadata file yet."""
  return ('read_only=True' in message or 'directory is read only' in message
          or message.startswith('Metadata file does not exist'))   # a save being written


class _OrbaxErrors(logging.Filter):
  """Moves orbax's ERROR records (and its notices that a reader's manager is
  read-only) to :data:`DETAILS` at DEBUG."""

  def filter(self, record: logging.LogRecord) -> bool:
    if not record.pathname.startswith(_ORBAX_DIR):
      return True
    if record.levelno < logging.ERROR and not _READ_ONLY_NOTICE(record.getMessage()):
      return True
    DETAILS.debug('orbax: %s', record.getMessage(), exc_info=record.exc_info)
    return False


_FILTER = _OrbaxErrors()


def divert_errors() -> None:
  """Moves orbax's ERROR records to :data:`DETAILS` (idempotent)."""
  logger = logging.getLogger('absl')
  with _lock:
    if _FILTER not in logger.filters:
      logger.addFilter(_FILTER)
