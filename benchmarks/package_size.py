"""The package's size, as issue #26 counts it: lines, code lines (a line with a
token that is not part of a docstring or comment) and public top-level names
(module-level functions and classes without a leading underscore), over
``purax/**/*.py``. Prints JSON.

Usage: python benchmarks/package_size.py [PACKAGE_DIR]
"""

import argparse
import ast
import io
import json
import pathlib
import tokenize

SKIP = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
        tokenize.ENDMARKER)


def count(root: pathlib.Path) -> dict:
  total = code = public = 0
  for path in sorted(root.rglob('*.py')):
    src = path.read_text()
    total += len(src.splitlines())
    tree = ast.parse(src)
    docs = set()
    for node in ast.walk(tree):
      body = getattr(node, 'body', None)
      if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
          and body and isinstance(body[0], ast.Expr) \
          and isinstance(getattr(body[0], 'value', None), ast.Constant) \
          and isinstance(body[0].value.value, str):
        docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
      if tok.type not in SKIP:
        lines.update(range(tok.start[0], tok.end[0] + 1))
    code += len(lines - docs)
    public += sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and not n.name.startswith('_') for n in tree.body)
  return {'lines': total, 'code_lines': code, 'public_top_level_names': public}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('package', nargs='?', default='purax')
  print(json.dumps(count(pathlib.Path(parser.parse_args().package))))


if __name__ == '__main__':
  main()
