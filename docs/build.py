"""Builds the API reference (HTML, pdoc) from the docstrings; fails on any warning.

  python docs/build.py [OUT]          # default docs/api; `make docs` runs this

pdoc imports every module of purax (so the ``cli``, ``data`` and ``testing``
extras must be installed) and renders Google-style docstrings. A warning — an
annotation it cannot resolve, a module that fails to import, a broken
docstring — is an error here: the script prints each and exits 1, leaving
the previous output in place (the new one is written next to it and renamed
in only on success).
"""

import os
import shutil
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(out: str) -> list[str]:
  """Renders ``purax`` into ``out``; returns the warnings (none: success)."""
  sys.path.insert(0, ROOT)
  import pdoc
  import pdoc.render
  pdoc.render.configure(docformat='google', show_source=True,
                        footer_text='purax API reference')
  tmp = out.rstrip('/') + '.tmp'
  shutil.rmtree(tmp, ignore_errors=True)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    pdoc.pdoc('purax', output_directory=__import__('pathlib').Path(tmp))
  # Warnings from pdoc itself (what it could not document); a library's own
  # DeprecationWarning at import is not about our docs.
  problems = [f'{w.category.__name__}: {w.message}' for w in caught
              if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))]
  if problems:
    shutil.rmtree(tmp, ignore_errors=True)
    return problems
  shutil.rmtree(out, ignore_errors=True)
  os.replace(tmp, out)
  return []


def main(argv: list[str]) -> int:
  out = argv[0] if argv else os.path.join(ROOT, 'docs', 'api')
  problems = build(out)
  for p in problems:
    print(f'docs: {p}', file=sys.stderr)
  if problems:
    print(f'docs: {len(problems)} warning(s); nothing written to {out}', file=sys.stderr)
    return 1
  print(f'docs: API reference written to {out}/index.html')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
