"""Serialized prediction functions through ``jax.export``, with a symbolic batch.

``export_predict`` bakes the parameters into a StableHLO artifact whose input
is ``[batch, ...features]`` with ``batch`` symbolic, so one file serves every
batch size; ``load_predict`` runs it with nothing but jax — no model code.
``signature.json`` records the artifact's SHA-256; ``load_predict`` checks it,
so a flipped, truncated or replaced file is refused, never run.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from purax.core.errors import DataError, expect

ARTIFACT = 'predict.jaxexport'
SIGNATURE = 'signature.json'


def export_predict(predict: Callable[[jax.Array], jax.Array], input_shape: Sequence[int],
                   directory: str, *, dtype=jnp.float32, platforms: Sequence[str] | None = None,
                   metadata: dict | None = None) -> str:
  """Exports ``predict`` (``[batch, *input_shape] -> [batch, ...]``) to ``directory``.

  Args:
    predict: a pure function of the inputs only (close over the parameters).
    input_shape: the per-example shape, e.g. ``(8, 8, 1)``.
    directory: receives ``predict.jaxexport`` and ``signature.json``; written
      to temporary names and renamed, so a failure leaves no partial artifact.
    dtype: the input dtype.
    platforms: lowering platforms (default: the current backend).
    metadata: extra JSON for ``signature.json``.

  Returns:
    The artifact's path.
  """
  (batch,) = jax.export.symbolic_shape('batch')
  spec = jax.ShapeDtypeStruct((batch, *input_shape), dtype)
  exported = jax.export.export(jax.jit(predict), platforms=platforms)(spec)
  os.makedirs(directory, exist_ok=True)
  out = exported.out_avals[0]
  signature = {'input': {'shape': ['batch', *map(int, input_shape)], 'dtype': str(np.dtype(dtype))},
               'output': {'shape': ['batch', *map(int, out.shape[1:])], 'dtype': str(out.dtype)},
               'platforms': list(exported.platforms), **(metadata or {})}
  path = os.path.join(directory, ARTIFACT)
  payload = exported.serialize()
  signature['sha256'] = hashlib.sha256(payload).hexdigest()
  with open(path + '.tmp', 'wb') as f:
    f.write(payload)
  with open(os.path.join(directory, SIGNATURE + '.tmp'), 'w') as f:
    json.dump(signature, f, indent=2)
  os.replace(path + '.tmp', path)
  os.replace(os.path.join(directory, SIGNATURE + '.tmp'), os.path.join(directory, SIGNATURE))
  return path


def load_predict(path: str) -> Callable[[np.ndarray], jax.Array]:
  """Loads an exported artifact (file or its directory) as ``x -> outputs``.

  Raises:
    DataError: the file is missing, differs from the SHA-256 that
      ``signature.json`` beside it records (flipped, truncated, replaced), is
      not a jax.export artifact, or inputs have the wrong per-example shape.
  """
  if os.path.isdir(path):
    path = os.path.join(path, ARTIFACT)
  expect(os.path.isfile(path), 'export artifact', 'an existing file', repr(path))
  with open(path, 'rb') as f:
    payload = f.read()
  signature_path = os.path.join(os.path.dirname(path), SIGNATURE)
  if os.path.isfile(signature_path):
    try:
      with open(signature_path) as f:
        want = json.load(f).get('sha256')
    except (ValueError, AttributeError) as e:
      raise DataError(f'export artifact: expected a readable {signature_path}, got {e}'
                      ) from None
    got = hashlib.sha256(payload).hexdigest()
    expect(want is None or want == got, f'export artifact {path!r}',
           f'SHA-256 {want} (as {SIGNATURE} records)', f'{got}: the file changed', DataError)
  try:
    exported = jax.export.deserialize(bytearray(payload))
  except Exception as e:   # flatbuffer/struct/version errors of a file that is no artifact
    raise DataError(f'export artifact {path!r}: expected a jax.export artifact, got '
                    f'bytes it cannot read ({type(e).__name__}: {e})') from None
  expected = tuple(exported.in_avals[0].shape[1:])
  dtype = exported.in_avals[0].dtype

  def predict(x):
    x = jnp.asarray(x, dtype)
    expect(tuple(x.shape[1:]) == expected, 'x.shape',
           f'[batch, {", ".join(map(str, expected))}]', tuple(x.shape))
    return exported.call(x)

  return predict
