"""One bounds table (:data:`purax.core.bounds.BOUNDS`) that every builder
reads: a value outside a row's interval is refused (by each optimizer builder:
tests/core/test_bounds.py) by ``purax.set_hyperparams``, by a population and by ``purax train``'s config
with the same named error (``ConfigError``, ``NAME: expected a finite value in
INTERVAL, got VALUE``); and the learning rate has one name from the flag to
the state (issue #45)."""

import inspect

import jax
import numpy as np
import pytest

import purax
from purax.app import hparam_table
from purax.app.config import TrainConfig
from purax.app.optimizer_table import OPTIMIZERS
from purax.core import bounds as bounds_lib
from purax.core import population as pop_lib
from purax.core.errors import ConfigError
from tests.helpers_bounds import BUILDERS, outside, refused

@pytest.mark.parametrize('name', ['learning_rate', 'weight_decay', 'b1', 'b2', 'eps',
                                  'clip_norm'])
def test_set_hyperparams_a_population_and_the_cli_refuse_it_the_same_way(name):
  task = purax.Task(model=purax.nn.MLP(num_classes=3, features=(4,)),
                    tx=purax.adamw(learning_rate=1e-3, total_steps=10))
  batch = {'x': np.zeros((2, 5), np.float32), 'y': np.zeros((2,), np.int32)}
  state = task.init(jax.random.key(0), batch)
  for value in outside(bounds_lib.BOUNDS[name]):
    with pytest.raises(ConfigError, match=refused(name, value, 'hyperparameter ')):
      purax.set_hyperparams(state, **{name: value})
    good = float(purax.hyperparams(state)[name])
    with pytest.raises(ConfigError, match=refused(name, value, 'hyperparameter ', '[1]')):
      pop_lib.init(task, jax.vmap(jax.random.key)(np.arange(2)),
                   {name: np.float32([good, value])}, batch)
    if name in hparam_table.BY_FIELD:
      with pytest.raises(ConfigError, match=refused(name, value)):
        TrainConfig.of(**{name: value}).validate()


def test_the_learning_rate_has_one_name_from_the_flag_to_the_state():
  """``--learning-rate`` -> the config field -> the table row's state name ->
  each builder's keyword -> ``opt_state.hyperparams``: ``learning_rate`` at
  every hop (before 0.3 the state said ``peak_learning_rate``)."""
  row = hparam_table.BY_FIELD['learning_rate']
  assert (row.field, row.state) == ('learning_rate', 'learning_rate')
  assert all(r.field == r.state for r in hparam_table.HPARAMS)
  batch = {'x': np.zeros((2, 5), np.float32), 'y': np.zeros((2,), np.int32)}
  for name, spec in OPTIMIZERS.items():
    assert 'learning_rate' in spec.hparams, name
    assert 'learning_rate' in inspect.signature(BUILDERS[name]).parameters
    tx = spec.transformation({n: r.default for n, r in hparam_table.BY_STATE.items()},
                             total_steps=10, warmup_steps=0, weight_decay_mask=None)
    state = purax.Task(model=purax.nn.MLP(num_classes=3, features=(4,)),
                       tx=tx).init(jax.random.key(0), batch)
    assert 'learning_rate' in purax.core.hparams.names(state), name
    assert 'peak_learning_rate' not in purax.core.hparams.names(state), name
