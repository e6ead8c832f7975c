"""The bounds table (:data:`purax.core.bounds.BOUNDS`): every optimizer builder
takes the rows it has arguments for, and refuses a value outside a row's
interval with the one named error (``ConfigError``, ``NAME: expected a finite
value in INTERVAL, got VALUE``). The same refusal by ``purax.set_hyperparams``,
a population and ``purax train``'s config: tests/app/test_hparam_table.py."""

import inspect

import pytest

from purax.core import bounds as bounds_lib
from purax.core.errors import ConfigError
from tests.helpers_bounds import BUILDERS, outside, refused

CASES = [(opt, name, v) for opt, build in BUILDERS.items()
         for name in inspect.signature(build).parameters if name in bounds_lib.BOUNDS
         for v in outside(bounds_lib.BOUNDS[name])]


def test_every_builder_takes_the_table_rows_it_has_arguments_for():
  assert {n for _, n, _ in CASES} == {'learning_rate', 'weight_decay', 'b1', 'b2', 'eps',
                                      'clip_norm', 'momentum', 'decay_start',
                                      'cooldown_steps'}
  assert bounds_lib.BOUNDS['learning_rate'].interval() == '(0, 10]'


@pytest.mark.parametrize('optimizer, name, value', CASES)
def test_a_builder_refuses_a_value_outside_the_table(optimizer, name, value):
  with pytest.raises(ConfigError, match=refused(name, value)):
    BUILDERS[optimizer](total_steps=10, **{name: value})
