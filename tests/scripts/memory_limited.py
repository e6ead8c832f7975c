"""``purax`` with the address space limited from the start of each training
attempt, so that a step whose compiled peak does not fit runs out of memory
for real (XLA's ``RESOURCE_EXHAUSTED`` on the CPU), as on an accelerator with
that much memory free.

    python -m tests.scripts.memory_limited HEADROOM_MIB train ...

Before each call of :func:`purax.fit` by ``purax train`` (its attempts and
the calibration of a run on a time budget, :mod:`purax.app.calibrate`) the soft
``RLIMIT_AS`` is set to the process's virtual size then plus ``HEADROOM_MIB``
MiB (compiling, the data and the threads before it are not counted). Run it
with ``MALLOC_ARENA_MAX=2`` so that threads do not reserve malloc arenas
inside the headroom.
"""

import resource
import sys

from purax.app import calibrate, runs


def virtual_size() -> int:
  """This process's virtual memory (bytes, ``/proc/self/status`` ``VmSize``)."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmSize:'):
        return int(line.split()[1]) * 1024
  raise RuntimeError('no VmSize in /proc/self/status')


def limited(fit, headroom: int):
  def fit_with_limit(*args, **kwargs):
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (virtual_size() + headroom, hard))
    try:
      return fit(*args, **kwargs)
    finally:
      resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
  return fit_with_limit


def main(argv: list[str]) -> int:
  headroom = int(float(argv[0]) * 2 ** 20)
  runs.fit = limited(runs.fit, headroom)
  calibrate.fit = limited(calibrate.fit, headroom)
  from purax.app import cli
  sys.argv = ['purax'] + argv[1:]
  return cli.main()


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
