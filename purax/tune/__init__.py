"""purax.tune: tuning hyperparameters in few compiled programs.

- :func:`lr_range_test` (:mod:`purax.tune.lr_range`): the learning-rate range
  test, every rate of a log-spaced grid trained at once as a population in one
  compiled program, and a suggested rate by a documented rule.
"""

from purax.tune.lr_range import LRRange as LRRange
from purax.tune.lr_range import RULES as RULES
from purax.tune.lr_range import log_grid as log_grid
from purax.tune.lr_range import lr_range_test as lr_range_test
from purax.tune.lr_range import suggest as suggest
