"""What every benchmark does with its result: one JSON file."""

from __future__ import annotations

import json
import os

from purax.io.safe_files import write_atomic


def write_json(path: str, result, *, indent: int = 2, say: bool = True) -> None:
  """Writes ``result`` as JSON to ``path``: its folder made, the file replaced
  atomically (a run cut short keeps the last complete result); ``say``
  prints where."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  write_atomic(path, json.dumps(result, indent=indent))
  if say:
    print(f'wrote {path}')
