"""The names of the range test's suggestion rules (each stated in
:mod:`purax.tune.lr_range`, which applies them) and the bounds that judge a
test usable, free of jax: the command line's ``purax tune lr --rule``
choices, checked before any work."""

from typing import Literal

#: The suggestion rules (see :mod:`purax.tune.lr_range`).
RULES = ('lowest', 'largest_within', 'steepest', 'minimum')

Rule = Literal[RULES]

#: The rule :func:`purax.tune.lr_range_test` and ``purax tune lr`` use unless told.
DEFAULT_RULE = 'lowest'

#: The fewest steps a range test reads a curve from: its window (the last
#: quarter) then holds at least two losses taken after six updates or more.
MIN_STEPS = 8

#: A member whose curve point (its mean loss over the window) ends above
#: this factor times its first loss counts as diverged.
DIVERGED_ABOVE = 2.0

#: ``'largest_within'``: the largest rate whose point is within this fraction of the least.
WITHIN = 0.1

#: A curve whose usable points span less than this fraction of the first loss is flat.
FLAT = 0.01
