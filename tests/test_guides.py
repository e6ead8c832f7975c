"""The user guides' code runs as written: every ```python block of each
docs/guides/*.md, in order, in one namespace per guide (in this process:
8 host devices, as the guides' mesh examples allow for)."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDES = sorted(glob.glob(os.path.join(ROOT, 'docs', 'guides', '*.md')))


@pytest.mark.parametrize('path', GUIDES, ids=[os.path.basename(p) for p in GUIDES])
def test_every_python_block_of_the_guide_runs(path, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)             # a block that writes, writes here
  text = open(path, encoding='utf-8').read()
  blocks = re.findall(r'```python\n(.*?)```', text, re.S)
  assert blocks
  scope = {'__name__': '__guide__'}
  for i, block in enumerate(blocks):
    exec(compile(block, f'{os.path.basename(path)} block {i + 1}', 'exec'), scope)
