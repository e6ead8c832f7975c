"""Fork one run into a population: K members that start from one state and
differ in their hyperparameters (:func:`fork`).

A state carries its hyperparameters as float32 arrays
(:mod:`purax.core.hparams`), so the members of a fork are K copies of the one
state with each member's values set; stepped as a population
(:func:`purax.core.population.step`, :class:`purax.plan.PopulationPlan`),
member ``i`` computes what the state, resumed alone with hyperparameters
``i``, computes (its step counter, its key and so its dropout masks, its
optimizer moments go on from the parent's).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from purax.core import hparams as hparams_lib
from purax.core import population as pop_lib
from purax.core.errors import ConfigError, expect
from purax.core.state import TrainState


def fork(state, hparams: Mapping[str, Any], *, members: int | None = None
         ) -> pop_lib.Population:
  """A population of ``members`` copies of ``state``, member ``i`` with hyperparameters ``i``.

  Example (a run trained 10 steps, then three learning rates from there):
    >>> task = purax.Task(model=purax.nn.MLP(features=(32,), num_classes=10),
    ...                   tx=purax.adamw(learning_rate=1e-3, total_steps=20))
    >>> state, _ = purax.fit(task, task.init(jax.random.key(0), batch), batches, steps=10)
    >>> pop = purax.fork(state, {'learning_rate': [1e-3, 3e-4, 1e-4]})
    >>> pop, _ = purax.fit(task, pop, batches, plan=purax.plan.PopulationPlan(task))
    >>> pop.state.step.tolist()                          # each member went on to step 20
    [20, 20, 20]

  Args:
    state: one run's :class:`purax.TrainState` (no member axis), or what holds
      one as ``.state`` (a :class:`purax.io.checkpoint.run.Restored`, an
      :func:`purax.open_run` run).
    hparams: ``name -> float [members]``: each member's value of a
      hyperparameter the state carries (:func:`purax.core.hparams.get`: the
      optimizer's injected ones, the loss's); a name left out keeps the
      state's value in every member.
    members: the population size; needed only when ``hparams`` is empty
      (otherwise the values' length).

  Returns:
    A :class:`purax.core.population.Population` whose every leaf has a
    leading ``[members]`` axis, nothing diverged or stopped; its step is the
    state's, so a loop starts at the branch point.

  Raises:
    ConfigError: ``state`` not a single TrainState (a stacked one included);
      a name the state does not carry (its optimizer cannot vary it), naming
      the names it carries; values of unequal lengths, or not ``[members]``;
      a value non-finite or out of its bounds (``hyperparameter NAME[i]``).
  """
  state = getattr(state, 'state', state)
  expect(isinstance(state, TrainState), 'state', 'a purax.TrainState (or a restored run '
         'holding one as .state)', type(state).__name__, ConfigError)
  expect(np.ndim(state.step) == 0, 'state', 'one run\'s state (step of shape [])',
         f'a state of step shape {list(np.shape(state.step))} (a population: fork '
         'one member, purax.core.population.member(pop, i))', ConfigError)
  expect(isinstance(hparams, Mapping), 'hparams', 'a mapping name -> [members] values',
         type(hparams).__name__, ConfigError)
  carried = hparams_lib.names(state)
  for name in hparams:
    expect(name in carried, 'hyperparameter name', f'one the state carries, one of '
           f'{list(carried)} (the parent\'s optimizer and loss cannot vary another)',
           repr(name), ConfigError)
  lengths = {name: int(np.shape(v)[0]) if np.ndim(v) == 1 else None
             for name, v in hparams.items()}
  sizes = set(lengths.values())
  expect(None not in sizes, 'hparams', 'one value per member ([members] each)',
         {n: list(np.shape(v)) for n, v in hparams.items()}, ConfigError)
  if members is None:
    expect(len(sizes) == 1, 'members', 'given, or the length of the hyperparameter values '
           '(hparams is empty)' if not sizes else 'one length of every value', lengths,
           ConfigError)
    members = sizes.pop()
  expect(isinstance(members, (int, np.integer)) and members >= 1, 'members', 'an int >= 1',
         members, ConfigError)
  values = pop_lib.check_hparams(hparams, int(members))
  stacked = jax.tree.map(lambda x: jnp.stack([x] * int(members)), state)
  stacked = hparams_lib.set(stacked, values)
  return pop_lib.Population(state=stacked, diverged=jnp.zeros((members,), bool),
                            stopped=jnp.zeros((members,), bool),
                            best=jnp.full((members,), jnp.inf, jnp.float32),
                            stale=jnp.zeros((members,), jnp.int32))
