"""The names of the strategies by which a population's members share the
machine (:func:`purax.core.population.chunk_size` states and applies them),
free of jax: the command line's ``--strategy`` choices."""

from typing import Literal, Union

#: The named strategies; an int ``C >= 1`` (chunks of ``C`` members) is one too.
STRATEGIES = ('auto', 'vmap', 'chunked', 'sequential')

Strategy = Union[Literal[STRATEGIES], int]
