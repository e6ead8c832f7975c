"""The metrics window of :func:`purax.fit`: the training metrics summed on
the device by every step since the last log point, read at the log points
into the step's record (the loop's one host sync), and begun anew. The loop
owns it; hooks read what it gave (``StepInfo.metrics`` and
``StepInfo.window``, :class:`purax.hooks.StepInfo`).

One name, *the window*: the loop's ``window`` (a
:class:`purax.metrics.Window`, the metrics tree packed into one float32
array), ``StepInfo.window`` (the host copy a log point read) and
:class:`Reader` (which reads it). Two keys keep their spelling on disk so
that runs written before resume: the checkpoint tree's ``'train_metrics'``
(:func:`purax.io.checkpoint.run.checkpoint_tree`, ``Restored.train_metrics``)
and the reader's state under the hook state's ``'log'``
(:data:`purax.hooks.runner.READER_KEY`, where :class:`purax.hooks.Log` kept
it before 0.3). A plan's ``train_step(state, acc, batch)`` takes and returns
the window as ``acc``."""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from purax.core import hparams as hparams_lib
from purax.core import metrics as metrics_lib
from purax.core.population import is_population
from purax.io import compile_time


def _train_state(state):
  """The :class:`TrainState` of ``state`` (a Population's stacked one)."""
  return state.state if is_population(state) else state


def _applied_packed(task, state):
  """The hyperparameters the last update applied: float32 ones packed into one
  :class:`purax.core.metrics.Window` (one host transfer at a log point instead
  of one per hyperparameter; float32 round-trips exactly), any other dtype as
  the tree itself."""
  values = hparams_lib.get(state, task.tx, applied=True)
  exact = all(getattr(x, 'dtype', None) == jax.numpy.float32 for x in jax.tree.leaves(values))
  return metrics_lib.window(values) if exact else values


# On the device (one small program per task, compiled at the start of a fit;
# read at log points).
_applied = jax.jit(_applied_packed, static_argnums=0)


class Reader:
  """Reads the loop's metrics window (``loop.window``) at each log point and
  starts it anew (the loop's one host sync).

  A log point writes ``train/*`` (the window's metrics), ``train/learning_rate``
  (the rate the last update applied, :func:`purax.core.hparams.get` with
  ``applied=True``, when the optimizer says it) and ``train/NAME`` for every
  other hyperparameter once it has changed during the run; ``steps_per_sec``
  (training throughput since the last log point, the hooks' time and the
  training programs' compilation left out; the steps still queued on the
  device count until they finish: the wait for the window is theirs); and
  ``compile_s``, the compilation seconds of the window when it compiled.
  """

  def __init__(self, loop):
    self.loop, self.logged = loop, None
    self.varying: set[str] = set()
    state = _train_state(loop.state)
    # On the device, read with the first log point: no host sync here.
    self.initial = _applied(loop.task, state) if hasattr(state, 'opt_state') else None
    self.clock = self._clock(loop.step)

  def _clock(self, step: int) -> tuple:
    loop = self.loop
    return (time.perf_counter(), step, loop.hook_seconds(), compile_time.seconds(),
            loop.hook_compile_seconds())

  def read(self, step: int) -> tuple[dict, Any]:
    """``(numbers, host window)`` of the steps since the last log point; starts a new window."""
    loop = self.loop
    hook_time = lambda: loop.hook_seconds() - loop.hook_compile_seconds()  # noqa: E731
    before = hook_time()
    applied = None if self.initial is None else _applied(loop.task, _train_state(loop.state))
    window, applied, initial = jax.device_get((loop.window, applied, self.initial))
    waited = hook_time() - before        # the device finishing the queued steps: step time
    self.initial = metrics_lib.as_tree(initial)     # on the host, unpacked once
    numbers = {f'train/{k}': v for k, v in metrics_lib.compute(window).items()}
    now, _, hook_s, compiled, hook_compiled = self._clock(step)
    compile_s = (compiled - self.clock[3]) - (hook_compiled - self.clock[4])
    seconds = (now - self.clock[0]) - (hook_s - self.clock[2] - waited) - compile_s
    numbers.update(self._hyperparams(applied))
    numbers['steps_per_sec'] = (step - self.clock[1]) / max(seconds, 1e-9)
    if compile_s > 0:
      numbers['compile_s'] = compile_s
    self.clock, self.logged = self._clock(step), step
    loop.window = metrics_lib.zeros_like(loop.window)
    return numbers, window

  def _hyperparams(self, applied) -> dict:
    if applied is None:
      return {}
    values = metrics_lib.as_tree(applied)
    self.varying |= {k for k, v in values.items()
                     if k in self.initial and not np.array_equal(v, self.initial[k])}
    return {f'train/{k}': v if np.ndim(v) else float(v) for k, v in sorted(values.items())
            if k == 'learning_rate' or k in self.varying}

  def state_dict(self) -> dict:
    return {'varying': sorted(self.varying)}

  def load_state_dict(self, d: dict) -> None:
    self.varying = set(d.get('varying', ()))
