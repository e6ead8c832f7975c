"""A tiny MLP for `purax train --model tests.scripts.tiny_mlp:mlp`: runs whose
checkpoints are small enough to keep as fixtures (tests/fixtures/runs_before_guards)."""

import purax


def mlp(num_classes: int, dtype=None, param_dtype=None):
  kwargs = {k: v for k, v in (('dtype', dtype), ('param_dtype', param_dtype)) if v is not None}
  return purax.nn.MLP(num_classes=num_classes, features=(8,), **kwargs)
