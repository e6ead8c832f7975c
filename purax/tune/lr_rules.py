"""The names of the range test's suggestion rules (each stated in
:mod:`purax.tune.lr_range`, which applies them), free of jax: the command
line's ``purax tune lr --rule`` choices."""

from typing import Literal

#: The suggestion rules (see :mod:`purax.tune.lr_range`).
RULES = ('steepest', 'minimum')

Rule = Literal[RULES]
