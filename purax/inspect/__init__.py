"""purax.inspect: looking at a model and a step from outside the step's path.

Nothing here is imported by :class:`purax.Task`'s step; each module reads a
state, a compiled program or a replay:

- :mod:`purax.inspect.summary` — parameters, bytes and shardings per module
  from shapes alone, and a compiled step's cost (``purax.summary``);
- :mod:`purax.inspect.flops` — model FLOPs per token, peak FLOP/s, MFU;
- :mod:`purax.inspect.nan` — where a non-finite value of an update came from
  (``purax.find_nonfinite``, ``purax debug-nan``);
- :mod:`purax.inspect.intercept` — every module call of a traced model
  handed to a hook (linen, NNX, Equinox), through the adapters' one seam
  :func:`purax.core.model.intercepted`.

Until 0.3 these lived in :mod:`purax.core` (``purax.core.summary``, ...);
those import paths still work, with a DeprecationWarning, until 0.4.
"""
