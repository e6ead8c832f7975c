"""purax.plan.feed: the one "copy this batch?" decision, and every stage of
staging going through it."""

import numpy as np
import pytest

from purax.plan import feed


@pytest.mark.parametrize('fresh, held, platform, copy', [
    (True, False, 'cpu', False), (True, True, 'cpu', False), (True, True, 'gpu', False),
    (False, False, 'cpu', True), (False, True, 'gpu', True), (False, False, 'gpu', False)])
def test_a_batch_is_copied_where_something_could_read_it_after_its_loader_moved_on(
    fresh, held, platform, copy):
  assert feed.copy_needed(fresh, held=held, platform=platform) is copy


def test_every_stage_copies_through_the_one_decision(monkeypatch):
  """to_step, prefetch_to_device and stacked's single steps copy by feed.own
  (so by copy_needed): a source that holds its batches is never copied."""
  calls = []
  real = feed.owned
  monkeypatch.setattr(feed, 'owned', lambda b: calls.append(1) or real(b))
  batches = [{'x': np.full((2,), i, np.float32)} for i in range(3)]
  for fresh in (False, True):
    calls.clear()
    list(feed.to_step(iter(batches), 2, copied=fresh))                  # the CPU: numpy
    list(feed.prefetch_to_device(iter(batches), 2, fresh=fresh))
    list(feed.stacked(iter(batches), 1, 2, fresh=fresh))                # step 1 single
    assert len(calls) == (0 if fresh else 3 + 3 + 1)


def test_a_copied_batch_shares_no_memory_with_its_source():
  batch = {'x': np.arange(4.0), 'n': 3}
  mine = feed.own(batch)
  assert not np.shares_memory(mine['x'], batch['x']) and mine['n'] == 3
  assert feed.own(batch, fresh=True) is batch
