"""Every kind of damage to a checkpoint that the fault attacks found, as
functions of a step directory (the corruption tests and the fault tests)."""

import glob
import json
import os
import shutil
import subprocess

import numpy as np


def tmpfs(mount, size: str):
  """Mounts a ``size`` tmpfs at ``mount`` (a new directory) so that a save
  really runs out of space; yields it, then unmounts. Skips without root."""
  import pytest
  mount.mkdir()
  done = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(mount)],
                        capture_output=True)
  if done.returncode != 0:
    pytest.skip(f'cannot mount a tmpfs here: {done.stderr.decode().strip()}')
  yield mount
  subprocess.run(['umount', '-l', str(mount)], check=False)


def _largest_data_file(step_dir):
  files = glob.glob(f'{step_dir}/state/ocdbt.process_0/d/*')
  return max(files, key=os.path.getsize)


def _rewrite(path, fn):
  with open(path, 'rb') as f:
    data = f.read()
  with open(path, 'wb') as f:
    f.write(fn(data))


def _flip(data, n=16, seed=0):
  data = bytearray(data)
  for i in np.random.default_rng(seed).choice(len(data), size=min(n, len(data)),
                                              replace=False):
    data[i] ^= 0xFF
  return bytes(data)


def _garble(data):
  return np.random.default_rng(1).integers(0, 256, len(data), dtype=np.uint8).tobytes()


def _edit_json(path):
  with open(path) as f:
    extra = json.load(f)
  extra['data']['next_step'] += 1    # still valid JSON: only its checksum tells
  with open(path, 'w') as f:
    json.dump(extra, f)


def _drop_record(path, key, reseal=False):
  """Deletes an integrity record from a step's JSON; ``reseal`` recomputes its
  SHA-256, as whoever swapped the arrays would (issue 28.2)."""
  from purax.io.checkpoint import integrity
  with open(path) as f:
    extra = json.load(f)
  del extra[key]
  if reseal:
    extra['sha256'] = integrity.json_digest(extra)
  with open(path, 'w') as f:
    json.dump(extra, f)


def _empty_dir(step_dir):
  shutil.rmtree(step_dir)
  os.mkdir(step_dir)


# Every kind of damage the fault attack found (issue 13, items 1 and 4).
CORRUPTIONS = {
    'empty manifest.ocdbt': lambda d: _rewrite(f'{d}/state/manifest.ocdbt', lambda b: b''),
    'zeroed data file': lambda d: _rewrite(_largest_data_file(d), lambda b: bytes(len(b))),
    'deleted data file': lambda d: os.remove(_largest_data_file(d)),
    'garbled data file': lambda d: _rewrite(_largest_data_file(d), _garble),
    'truncated data file': lambda d: _rewrite(_largest_data_file(d), lambda b: b[:len(b) // 3]),
    'flipped bytes in data file': lambda d: _rewrite(_largest_data_file(d), _flip),
    'one flipped bit': lambda d: _rewrite(_largest_data_file(d), lambda b: bytes(
        [*b[:len(b) // 2], b[len(b) // 2] ^ 1, *b[len(b) // 2 + 1:]])),
    'deleted _METADATA': lambda d: os.remove(f'{d}/state/_METADATA'),
    'garbled _METADATA': lambda d: _rewrite(f'{d}/state/_METADATA', _garble),
    'garbled extra JSON': lambda d: _rewrite(f'{d}/extra/metadata', _garble),
    'truncated extra JSON': lambda d: _rewrite(f'{d}/extra/metadata', lambda b: b[:len(b) // 3]),
    'edited extra JSON': lambda d: _edit_json(f'{d}/extra/metadata'),
    'garbled array_metadatas': lambda d: _rewrite(
        f'{d}/state/array_metadatas/process_0', _garble),
    'empty step directory': _empty_dir,
    # A removed record must not turn its check off (issue 28.2).
    'removed sha256 record': lambda d: _drop_record(f'{d}/extra/metadata', 'sha256'),
    'removed fingerprints, resealed': lambda d: _drop_record(
        f'{d}/extra/metadata', 'fingerprints', reseal=True),
    'removed signature, resealed': lambda d: _drop_record(
        f'{d}/extra/metadata', 'signature', reseal=True),
}
# Damage to files that restore does not need: the arrays read still match
# their checksums, so the newest checkpoint is restored.
HARMLESS = {
    'empty process manifest': lambda d: _rewrite(
        f'{d}/state/ocdbt.process_0/manifest.ocdbt', lambda b: b''),
    'deleted array_metadatas': lambda d: shutil.rmtree(f'{d}/state/array_metadatas'),
    'deleted _CHECKPOINT_METADATA': lambda d: os.remove(f'{d}/_CHECKPOINT_METADATA'),
}
