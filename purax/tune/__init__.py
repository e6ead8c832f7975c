"""purax.tune: tuning hyperparameters in few compiled programs.

- :func:`lr_range_test` (:mod:`purax.tune.lr_range`): the learning-rate range
  test, every rate of a log-spaced grid trained at once as a population in one
  compiled program, and a suggested rate by a documented rule (:data:`RULES`).

Its names are bound on first use (:func:`purax.core.lazy.attach`): the
command line reads :data:`RULES` without importing jax.
"""

from purax.core import lazy as _lazy

_PUBLIC = {
    'LRRange': 'purax.tune.lr_range:LRRange',
    'RULES': 'purax.tune.lr_rules:RULES',
    'RangeTestError': 'purax.tune.lr_range:RangeTestError',
    'log_grid': 'purax.tune.lr_range:log_grid',
    'lr_range_test': 'purax.tune.lr_range:lr_range_test',
    'suggest': 'purax.tune.lr_range:suggest',
}
#: The public names, each bound on first use (:func:`purax.core.lazy.attach`).
__all__ = sorted(_PUBLIC)
__getattr__, __dir__ = _lazy.attach(__name__, _PUBLIC)
# Renamed in 0.3 (no two modules of one file name): the old import path still works.
_lazy.moved('purax.tune.rules', 'purax.tune.lr_rules')
