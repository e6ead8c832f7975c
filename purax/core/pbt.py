"""Population-based training: exploit / explore as one pure function.

Jaderberg et al. 2017, "Population Based Training of Neural Networks"
(arXiv:1711.09846), with truncation selection: the worst ``fraction`` of the
members (by a score, lower is better) copy the whole training state of members
drawn uniformly from the best ``fraction`` (exploit), then multiply some
hyperparameters by a factor drawn from ``factors`` (explore). Everything
happens on the device on the stacked state, seeded by an explicit key, so it
runs inside ``jax.jit`` with no host transfer and reruns identically.

Example: of eight members, the two worst by score copy a state drawn from
the two best:

  >>> from purax.core import pbt, population
  >>> task = purax.Task(model=purax.nn.MLP(features=(16,), num_classes=10),
  ...                   tx=optax.inject_hyperparams(optax.sgd)(learning_rate=0.1))
  >>> rates = {'learning_rate': jnp.geomspace(1e-3, 1.0, 8)}
  >>> pop = population.init(task, jax.vmap(jax.random.key)(jnp.arange(8)), rates, batch)
  >>> scores = jnp.array([0.9, 0.2, 0.5, 0.4, 0.8, 0.3, 0.6, 0.7])   # e.g. eval losses
  >>> pop, info = pbt.exploit_explore(pop, scores, key=jax.random.key(1),
  ...                                 names=('learning_rate',))
  >>> [int(i) for i in jnp.flatnonzero(info['copied'])]                # the two worst
  [0, 4]
  >>> all(int(info['source'][i]) in (1, 5) for i in (0, 4))           # from the two best
  True
"""

from __future__ import annotations

import functools
import math
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from purax.core.errors import ConfigError, expect
from purax.core import hparams as hparams_lib
from purax.core.population import Population

_MAX = float(np.finfo(np.float32).max)


def _check(members: int, fraction: float, factors: Sequence[float]) -> int:
  expect(0.0 < fraction <= 0.5, 'fraction', 'in (0, 0.5]', fraction, ConfigError)
  expect(len(factors) >= 1 and all(math.isfinite(f) and f > 0 for f in factors), 'factors',
         'one or more finite positive numbers', tuple(factors), ConfigError)
  return max(1, int(fraction * members)) if members >= 2 else 0


@functools.partial(jax.jit, static_argnames=('fraction', 'factors', 'names', 'bounds'))
def _exploit_explore(pop, scores, key, *, fraction, factors, names, bounds):
  members = pop.num_members
  n = _check(members, fraction, factors)
  if n == 0:
    return pop, {'source': jnp.arange(members, dtype=jnp.int32),
                 'copied': jnp.zeros((members,), bool)}
  scores = jnp.where(jnp.isnan(scores), jnp.inf, scores.astype(jnp.float32))
  # Stable: ties keep member order, so the outcome depends only on (scores, key).
  order = jnp.argsort(scores, stable=True)
  top, bottom = order[:n], order[members - n:]
  pick_key, perturb_key = jax.random.split(key)
  picks = top[jax.random.randint(pick_key, (n,), 0, n)]
  source = jnp.arange(members).at[bottom].set(picks).astype(jnp.int32)
  copied = jnp.zeros((members,), bool).at[bottom].set(True)

  # Exploit: copy every leaf of the source member except the member's own key,
  # and its status (a diverged bottom member is revived by a healthy copy).
  take = lambda x: jnp.take(x, source, axis=0)   # noqa: E731
  state = jax.tree.map(take, pop.state).replace(rng=pop.state.rng)
  new = pop.replace(state=state, diverged=take(pop.diverged), stopped=take(pop.stopped),
                    best=take(pop.best), stale=take(pop.stale))

  # Explore: perturb the copied members' hyperparameters by a random factor.
  hparams = hparams_lib.get(new.state)
  names = names if names is not None else ('learning_rate',)
  for name in names:
    expect(name in hparams, 'names', f'hyperparameters among {sorted(hparams)}',
           repr(name), ConfigError)
  table = jnp.asarray(factors, jnp.float32)
  keys = jax.random.split(perturb_key, len(names))
  perturbed = {}
  for name, k in zip(names, keys):
    factor = table[jax.random.randint(k, (members,), 0, len(factors))]
    value = jnp.where(copied, hparams[name] * factor, hparams[name])
    # Finite ends: a perturbed value is finite unless its source was not (a
    # hyperparameter traced here is not checked; the step's guard skips it).
    lo, hi = np.clip(dict(bounds).get(name, hparams_lib.DEFAULT_BOUNDS.clip()), -_MAX, _MAX)
    perturbed[name] = jnp.clip(value, lo, hi).astype(jnp.float32)
  new = new.replace(state=hparams_lib.set(new.state, perturbed))
  return new, {'source': source, 'copied': copied}


def exploit_explore(pop: Population, scores: jax.Array, *, key: jax.Array,
                    fraction: float = 0.25, factors: Sequence[float] = (0.8, 1.25),
                    names: Sequence[str] | None = None,
                    bounds: Mapping[str, tuple[float, float]] | None = None):
  """One PBT round on a stacked population (pure, jitted, seeded).

  Args:
    pop: the :class:`Population`, ``[members, ...]`` on every leaf.
    scores: float32 ``[members]``, lower is better (e.g.
      :func:`purax.core.population.score`); NaN counts as worst.
    key: a typed PRNG key; the same key and scores give the same result.
    fraction: the share of members replaced, in ``(0, 0.5]``; at least one
      member is replaced when there are two or more.
    factors: explore multipliers, one drawn uniformly per copied member and
      hyperparameter (Jaderberg et al. use 0.8 and 1.2).
    names: hyperparameters to perturb (default: ``('learning_rate',)``; a
      name before 0.3, ``'peak_learning_rate'``, with a ``DeprecationWarning``).
    bounds: name -> (low, high) clip after perturbing (default:
      :data:`purax.core.hparams.BOUNDS`; others are clipped to ``[0, inf)``);
      an infinite end clips at float32's largest value, so a perturbed value
      is finite unless the member's was (traced here, unchecked by the
      setter: the step's guard skips that member's updates).

  Returns:
    ``(pop, info)``: each copied member holds its source's params,
    model_state, opt_state (with perturbed hyperparameters, still float32),
    step and status, and keeps its own ``rng``; ``info['source']`` int32
    ``[members]`` (member ``i`` now descends from ``source[i]``; ``i`` when not
    copied) and ``info['copied']`` bool ``[members]``.

  Raises:
    ConfigError: ``fraction`` out of range, non-positive or non-finite
      factors, or an unknown hyperparameter name.
  """
  bounds = {n: hparams_lib.bounds(n).clip() for n in hparams_lib.BOUNDS} if bounds is None else bounds
  expect(jnp.shape(scores) == (pop.num_members,), 'scores.shape',
         f'[{pop.num_members}] (members)', list(jnp.shape(scores)), ConfigError)
  return _exploit_explore(pop, jnp.asarray(scores), key, fraction=float(fraction),
                          factors=tuple(float(f) for f in factors),
                          names=None if names is None else tuple(map(hparams_lib.canonical, names)),
                          bounds=tuple(sorted((k, tuple(v)) for k, v in bounds.items())))
