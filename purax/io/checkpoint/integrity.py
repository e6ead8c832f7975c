"""Integrity: a 64-bit fingerprint of every stored array (independent of
sharding) and a SHA-256 of the checkpoint's JSON, both verified on restore."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from purax.io.checkpoint.layout import HOST_LEAF_BYTES, PyTree, small_whole, storable


class Unreadable(Exception):
  """A checkpoint's files cannot be read or fail their checksums (internal:
  restore falls back to an older checkpoint)."""


# -- checksums ------------------------------------------------------------------

_U32 = jnp.uint32


def _fmix32(h, u32=_U32):
  """MurmurHash3's 32-bit finaliser (every input bit affects every output bit);
  ``u32`` is ``jnp.uint32`` on the device, ``np.uint32`` on the host."""
  h = h ^ (h >> u32(16))
  h = h * u32(0x85EBCA6B)
  h = h ^ (h >> u32(13))
  h = h * u32(0xC2B2AE35)
  return h ^ (h >> u32(16))


def _mix(w, index, u32):
  """The two mixes of (word, position) whose wrapping uint32 sums make a leaf's
  fingerprint: the one formula, for ``jnp`` arrays on the device and ``np``
  arrays on the host (``u32``: ``jnp.uint32`` or ``np.uint32``)."""
  a = _fmix32(w ^ _fmix32(index * u32(0x9E3779B9) + u32(1), u32), u32)
  b = _fmix32(w + _fmix32(index ^ u32(0x7F4A7C15), u32), u32)
  return a, b


def _words(x):
  """``x``'s bits as uint32 words (one per element; two for 8-byte dtypes), or None."""
  if x.dtype == jnp.bool_:
    return x.astype(_U32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}.get(x.dtype.itemsize)
  if unsigned is None or jnp.issubdtype(x.dtype, jnp.complexfloating):
    return None
  try:
    return jax.lax.bitcast_convert_type(x, unsigned).astype(_U32)
  except (TypeError, ValueError):   # a dtype XLA cannot bitcast (e.g. int4): not checked
    return None


def _leaf_fingerprint(x):
  """Two order-independent sums of a mix of (word, position): exact under any
  sharding (uint32 sums wrap, so the reduction order does not matter)."""
  w = _words(x)
  if w is None:
    return jnp.zeros((2,), _U32)
  index = jnp.zeros(w.shape, _U32)
  for d in range(w.ndim):
    stride = int(np.prod(w.shape[d + 1:], dtype=np.uint64)) % 2 ** 32
    index = index + jax.lax.broadcasted_iota(_U32, w.shape, d) * _U32(stride)
  a, b = _mix(w, index, _U32)
  return jnp.stack([jnp.sum(a, dtype=_U32), jnp.sum(b, dtype=_U32)])


@jax.jit
def _fingerprints_on_device(tree):
  return [_leaf_fingerprint(x) for x in jax.tree.leaves(tree)]


# Dtypes whose host fingerprint is computed by numpy, bit for bit the device's
# (not bool: for a byte other than 0 or 1, which numpy can be made to hold,
# numpy's and XLA's conversions differ).
_HOST_DTYPES = frozenset(np.dtype(d) for d in (
    np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32, np.float16, jnp.bfloat16,
    np.float32))


def _host_fingerprint(x: np.ndarray) -> np.ndarray:
  """``_leaf_fingerprint`` of a numpy array (a ``_HOST_DTYPES`` dtype) by numpy:
  the same words, flat row-major positions and :func:`_mix`."""
  x = np.ascontiguousarray(x).reshape(-1)
  u32 = np.uint32
  w = x.view(f'u{x.dtype.itemsize}').astype(u32)
  index = np.arange(w.size, dtype=u32)
  a, b = _mix(w, index, u32)
  return np.array([np.sum(a, dtype=u32), np.sum(b, dtype=u32)], u32)


def _on_host(x) -> bool:
  """Whether ``x`` is a leaf fingerprinted on the host: a numpy array, or an
  array that one process holds whole, of a ``_HOST_DTYPES`` dtype and at most
  ``HOST_LEAF_BYTES`` (numpy's hash makes ~5 temporaries of the leaf's size
  and runs on one core: larger leaves go to the device program)."""
  if isinstance(x, (np.ndarray, np.generic)):
    return x.dtype in _HOST_DTYPES and x.nbytes <= HOST_LEAF_BYTES
  return small_whole(x) and x.dtype in _HOST_DTYPES


def fingerprints(tree: PyTree) -> list[str]:
  """A 64-bit hex fingerprint of each leaf's bits (typed keys: their key data), in
  flattening order. Equal trees give equal fingerprints under any sharding.

  Leaves up to ``HOST_LEAF_BYTES`` of the common dtypes (``_HOST_DTYPES``)
  are hashed by numpy on the host, the rest by one jitted program: the same
  function either way, so a small state's save compiles nothing (the program
  took ~0.6 s to compile for the default job's state, once per process).
  """
  leaves = jax.tree.leaves(storable(tree))
  host = [i for i, x in enumerate(leaves) if _on_host(x)]
  device = sorted(set(range(len(leaves))) - set(host))
  sums = [None] * len(leaves)
  for i, x in zip(host, jax.device_get([leaves[i] for i in host])):
    sums[i] = _host_fingerprint(np.asarray(x))
  if device:
    on_device = _fingerprints_on_device([leaves[i] for i in device])
    for i, s in zip(device, jax.device_get(on_device)):
      sums[i] = s
  return [f'{int(s[0]):08x}{int(s[1]):08x}' for s in sums]


# How tensorstore reports files it cannot read or decode (its ValueErrors carry
# an absl status name).
_IO_STATUS = ('DATA_LOSS', 'NOT_FOUND', 'FAILED_PRECONDITION', 'OUT_OF_RANGE', 'Error reading',
              'Error opening', 'corrupt', 'Corrupt')


def is_io_error(e: BaseException) -> bool:
  """Whether ``e`` (or an exception it came from) is a file system or format error."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, (OSError, UnicodeError, json.JSONDecodeError, EOFError)):
      return True
    if isinstance(e, ValueError) and any(s in str(e) for s in _IO_STATUS):
      return True
    e = e.__cause__ or e.__context__
  return False


def json_digest(payload: Mapping[str, Any]) -> str:
  body = {k: v for k, v in payload.items() if k != 'sha256'}
  return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


RECORDS = ('sha256', 'fingerprints', 'signature')


def require_records(extra: Mapping[str, Any]) -> None:
  """Raises Unreadable unless a checkpoint's JSON has every integrity record
  (a removed record must not turn its check off)."""
  missing = [k for k in RECORDS if k not in extra]
  if missing:
    raise Unreadable(f'extra JSON: expected the integrity records {list(RECORDS)}, got none '
                     f'for {missing} (removed?; Checkpointer(verify=False) waives the checks)')


def check_fingerprints(saved: Sequence[str], tree: PyTree, sig: list[list]) -> None:
  got = fingerprints(tree)
  if len(got) != len(saved):
    raise Unreadable(f'checksums: expected {len(saved)} arrays, got {len(got)}')
  for (path, _, _), want, have in zip(sig, saved, got):
    if want != have:
      raise Unreadable(f'{path}: checksum mismatch (saved {want}, read {have}): '
                        'the bytes changed on disk')


def check_step(extra: Mapping[str, Any], step: int) -> None:
  """Raises Unreadable unless the step a checkpoint's JSON records (its data
  position, ``next_step``) is ``step``, its directory's name: a step directory
  renamed, copied or linked from another step is not that step's checkpoint.
  A JSON that records no step (written by other tools) is not checked."""
  data = extra.get('data')
  recorded = data.get('next_step') if isinstance(data, dict) else None
  if recorded is not None and recorded != step:
    raise Unreadable(f'extra JSON: records step {recorded!r} (its data position), not {step}, '
                     f'the name of its directory (renamed or linked from step {recorded!r}?)')
