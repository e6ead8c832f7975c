"""purax.plan.budget: sizes in words, and the one check of bytes needed
against bytes available (expect_fits)."""

import pytest

from purax.core.errors import ConfigError
from purax.plan import budget


def test_expect_fits_names_the_field_the_memory_available_and_needed():
  with pytest.raises(ConfigError) as e:
    budget.expect_fits(8 * 10 ** 9, 'spike_window', 10 ** 9, 'a window whose state',
                       how='float32 [window, 2]', hint='use less', available=4 * 2 ** 30)
  assert str(e.value) == ('spike_window: expected a window whose state fits in the 4.00 GiB '
                          'available (as given; use less), got 1000000000, needing 7.45 GiB '
                          '(float32 [window, 2])')
  budget.expect_fits(4 * 2 ** 30, 'x', 1, 'x', available=4 * 2 ** 30)      # exactly fits


def test_expect_fits_asks_the_device_only_for_a_large_need(monkeypatch):
  asked = []
  monkeypatch.setattr(budget, 'available_bytes', lambda device=None: asked.append(device)
                      or 100 * 2 ** 20)
  budget.expect_fits(budget.ALWAYS_FITS, 'batch_size', 64, 'a batch that')
  assert asked == []
  with pytest.raises(ConfigError, match=r'^batch_size: expected a batch that fits in the '
                     r"100.00 MiB available \((on .*|the host's available memory: cpu reports "
                     r'no device memory limit)\), got 9, needing 1.00 GiB$'):
    budget.expect_fits(2 ** 30, 'batch_size', 9, 'a batch that')
  assert len(asked) == 1
  monkeypatch.setattr(budget, 'available_bytes', lambda device=None: None)   # unknown
  budget.expect_fits(2 ** 40, 'batch_size', 9, 'a batch that')
