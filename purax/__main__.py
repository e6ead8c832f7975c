"""``python -m purax``: the ``purax`` command."""

import os
import sys

from purax.io import signals

signals.early()   # a signal during the imports below (a second) is recorded, then answered
try:
  from purax.app.cli import main
except SystemExit as e:   # a second signal during the imports: at once
  if e.code != signals.last_exit():
    raise
  print(f'purax: stopped by {signals.name(e.code - 128)} during start-up (a second signal: '
        f'at once; nothing written) (exit status {e.code})', file=sys.stderr, flush=True)
  os._exit(e.code)

sys.exit(main())
