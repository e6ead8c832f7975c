"""`purax train` that sends itself a signal at one named phase of its run.

Usage: python -m tests.scripts.signal_at_phase PHASE SIGNAL purax-train-args...

Phases (where the signal arrives):
  gc            start-up, inside a garbage-collector callback (where Python
                swallows an exception the handler raises), before the run
                directory is read
  data          while the job is built (data loading)
  summary       right after the model summary is printed
  first_step    as the first call of the step is traced and compiled
  training      before the 5th call
  evaluation    inside the first evaluation
  final_save    as the last checkpoint is saved
  double        twice before the 5th call
  double_gc     before the 5th call, then again inside a gc callback
"""

import gc
import os
import signal
import sys

phase, signum, argv = sys.argv[1], signal.Signals[sys.argv[2]], sys.argv[3:]

from purax.app import cli, job as job_lib, runs   # noqa: E402
from purax.hooks.builtin import Evaluate            # noqa: E402
from purax.io.checkpoint import Checkpointer       # noqa: E402
from purax.plan.single import SingleDevicePlan     # noqa: E402


def send():
  os.kill(os.getpid(), signum)


def send_in_gc():
  """The signal arrives while a gc callback runs: its handler runs there."""
  def callback(when, info):
    gc.callbacks.remove(callback)
    send()
    sum(range(1000))            # bytecodes inside the callback: the handler runs here
  gc.callbacks.append(callback)
  gc.collect()


def before(module, name, act, when=lambda *a, **k: True):
  real = getattr(module, name)

  def wrapped(*args, **kwargs):
    if when(*args, **kwargs):
      act()
    return real(*args, **kwargs)
  setattr(module, name, wrapped)


def after(module, name, act):
  real = getattr(module, name)

  def wrapped(*args, **kwargs):
    out = real(*args, **kwargs)
    act()
    return out
  setattr(module, name, wrapped)


def nth_call(n):
  calls = [0]

  def when(*args, **kwargs):
    calls[0] += 1
    return calls[0] == n
  return when


steps = int(argv[argv.index('--steps') + 1])
{
    'gc': lambda: before(runs, 'connect', send_in_gc),
    'data': lambda: before(job_lib, 'build', send),
    'summary': lambda: after(runs, 'print_summary', send),
    'first_step': lambda: before(SingleDevicePlan, 'train_step', send, nth_call(1)),
    'training': lambda: before(SingleDevicePlan, 'train_step', send, nth_call(5)),
    'evaluation': lambda: before(Evaluate, '__call__', send, nth_call(1)),
    'final_save': lambda: before(Checkpointer, 'save', send,
                                 lambda self, step, *a, **k: step == steps),
    'double': lambda: before(SingleDevicePlan, 'train_step', lambda: (send(), send()),
                             nth_call(5)),
    'double_gc': lambda: before(SingleDevicePlan, 'train_step', lambda: (send(), send_in_gc()),
                                nth_call(5)),
}[phase]()
sys.exit(cli.main(argv))
