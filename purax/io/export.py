"""Serialized prediction functions through ``jax.export``, with a symbolic batch.

``export_predict`` bakes the parameters into a StableHLO artifact whose input
is ``[batch, ...features]`` with ``batch`` symbolic, so one file serves every
batch size; ``load_predict`` runs it with nothing but jax — no model code.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from purax.core.errors import expect

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
  with open(path + '.tmp', 'wb') as f:
    f.write(exported.serialize())
  with open(os.path.join(directory, SIGNATURE + '.tmp'), 'w') as f:
    json.dump(signature, f, indent=2)
  os.replace(path + '.tmp', path)
  os.replace(os.path.join(directory, SIGNATURE + '.tmp'), os.path.join(directory, SIGNATURE))
  return path


def load_predict(path: str) -> Callable[[np.ndarray], jax.Array]:
  """Loads an exported artifact (file or its directory) as ``x -> outputs``.

  Raises:
    DataError: the file is missing, or inputs have the wrong per-example shape.
  """
  if os.path.isdir(path):
    path = os.path.join(path, ARTIFACT)
  expect(os.path.isfile(path), 'export artifact', 'an existing file', repr(path))
  with open(path, 'rb') as f:
    exported = jax.export.deserialize(bytearray(f.read()))
  expected = tuple(exported.in_avals[0].shape[1:])
  dtype = exported.in_avals[0].dtype

  def predict(x):
    x = jnp.asarray(x, dtype)
    expect(tuple(x.shape[1:]) == expected, 'x.shape',
           f'[batch, {", ".join(map(str, expected))}]', tuple(x.shape))
    return exported.call(x)

  return predict
