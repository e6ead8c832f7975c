"""Gradient checkpointing (remat) policies by name.

``jax.checkpoint`` recomputes activations in the backward pass instead of
storing them; a policy names what is still saved (Chen et al. 2016, "Training
Deep Nets with Sublinear Memory Cost"). Remat changes memory, not values.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from purax.core.errors import ConfigError, expect

#: name -> ``jax.checkpoint`` policy; ``'none'`` disables remat, ``'full'``
#: saves nothing (recomputes the whole block).
REMAT_POLICIES = {
    'none': None,
    'full': None,
    'dots_saveable': jax.checkpoint_policies.dots_saveable,
    'dots_with_no_batch_dims_saveable': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    'everything_saveable': jax.checkpoint_policies.everything_saveable,
    'nothing_saveable': jax.checkpoint_policies.nothing_saveable,
}


def check_remat(name: str) -> None:
  """Raises ConfigError unless ``name`` is a key of :data:`REMAT_POLICIES`."""
  expect(name in REMAT_POLICIES, 'remat', f'one of {sorted(REMAT_POLICIES)}', repr(name),
         ConfigError)


def remat(module_cls, name: str, *, static_argnums=(), prevent_cse: bool = True):
  """``module_cls`` wrapped in ``nn.remat`` under policy ``name`` (unchanged for 'none').

  Give the wrapped module an explicit ``name=`` when you instantiate it so
  that the parameter tree is the same with and without remat.
  """
  check_remat(name)
  if name == 'none':
    return module_cls
  return nn.remat(module_cls, policy=REMAT_POLICIES[name], static_argnums=static_argnums,
                  prevent_cse=prevent_cse)
