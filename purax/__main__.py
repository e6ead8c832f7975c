"""``python -m purax``: the ``purax`` command."""

import sys

from purax.app.cli import main

sys.exit(main())
