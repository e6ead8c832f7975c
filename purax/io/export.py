"""Serialized prediction functions with a symbolic batch: jax.export, ONNX, SavedModel.

``export_predict`` bakes the parameters into a StableHLO artifact whose input
is ``[batch, ...features]`` with ``batch`` symbolic, so one file serves every
batch size; ``load_predict`` runs it with nothing but jax — no model code.
``signature.json`` records the artifact's SHA-256; ``load_predict`` checks it,
so a flipped, truncated or replaced file is refused, never run.

:func:`export` picks the format: ``'jax'`` (this module, the default),
``'onnx'`` (:mod:`purax.io.onnx_export`, through jax2onnx, checked by
onnxruntime) or ``'savedmodel'`` (:mod:`purax.io.tf_export`, through jax2tf,
checked by loading it back). The ONNX and SavedModel exporters run the file
they wrote against the in-process ``predict`` at batch sizes 1 and 7 before
putting it in place, and refuse (:class:`ExportError`) a model that the format
cannot express or that it computes differently.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from purax.io import safe_files
from purax.io.formats import FORMATS as FORMATS
from purax.core import lazy
from purax.core.errors import ConfigError, DataError, PuraxError, expect

ARTIFACT = 'predict.jaxexport'
SIGNATURE = 'signature.json'
#: Batch sizes at which the ONNX and SavedModel exporters check their artifact.
CHECK_BATCH_SIZES = (1, 7)


class ExportError(PuraxError):
  """A format cannot express the model (an op, a dtype, a dynamic shape), or
  its artifact computes something else than the in-process ``predict``."""


def export(predict: Callable[[jax.Array], jax.Array], input_shape: Sequence[int],
           directory: str, *, format: str = 'jax', **kwargs) -> str:
  """Exports ``predict`` in ``format`` (a key of :data:`FORMATS`) to ``directory``.

  Args:
    predict: ``[batch, *input_shape] -> outputs``, a pure function of the
      inputs (close over the parameters).
    input_shape: the per-example shape.
    directory: where the artifact and ``signature.json`` go.
    format: ``'jax'`` (:func:`export_predict`), ``'onnx'``
      (:func:`purax.io.onnx_export.export_onnx`) or ``'savedmodel'``
      (:func:`purax.io.tf_export.export_savedmodel`).
    **kwargs: passed to the format's exporter (``dtype``, ``metadata``, ...).

  Returns:
    The artifact's path.

  Raises:
    ConfigError: an unknown format, or its extra is not installed;
    ExportError: the format cannot express the model.
  """
  expect(format in FORMATS, 'export format', ' or '.join(map(repr, FORMATS)), repr(format),
         ConfigError)
  return lazy.resolve(FORMATS[format])(predict, input_shape, directory, **kwargs)


def check_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
  """``input_shape`` as a tuple of positive ints, or a ConfigError naming it."""
  shape = tuple(input_shape)
  expect(all(isinstance(d, (int, np.integer)) and d >= 1 for d in shape), 'input_shape',
         'positive integers (the per-example shape, without the batch)', shape, ConfigError)
  return tuple(map(int, shape))


def check_inputs(inputs, input_shape: tuple[int, ...], dtype,
                 batch_sizes: Sequence[int] = CHECK_BATCH_SIZES) -> dict[int, np.ndarray]:
  """The inputs an exporter checks its artifact on: batch size -> ``[n, *input_shape]``.

  ``inputs`` (``[m, *input_shape]``, or None) gives the rows, repeated when
  ``m`` is smaller than a batch size; None draws a standard normal for float
  dtypes and 0/1 for integer and bool ones (pass token ids below the
  vocabulary size for a language model).
  """
  dtype = np.dtype(dtype)
  if inputs is None:
    rng = np.random.default_rng(0)
    n = max(batch_sizes)
    if np.issubdtype(dtype, np.floating):
      inputs = rng.standard_normal((n, *input_shape))
    else:
      inputs = rng.integers(0, 2, (n, *input_shape))
  inputs = np.asarray(inputs)
  expect(inputs.ndim == len(input_shape) + 1 and inputs.shape[1:] == input_shape
         and inputs.shape[0] >= 1, 'check_inputs.shape',
         f'[n >= 1, {", ".join(map(str, input_shape))}]', inputs.shape, ConfigError)
  inputs = inputs.astype(dtype)
  reps = -(-max(batch_sizes) // inputs.shape[0])
  inputs = np.concatenate([inputs] * reps)
  return {n: inputs[:n] for n in batch_sizes}


def compare(format: str, run: Callable[[np.ndarray], Sequence[np.ndarray]],
            predict: Callable, inputs: dict[int, np.ndarray], *, atol: float,
            rtol: float) -> float:
  """Runs the artifact (``run``) and ``predict`` on ``inputs``; the max abs difference.

  The reference runs jitted at ``'highest'`` matmul precision (no TF32 on a GPU).

  Raises:
    ExportError: an output's count, shape or dtype differs, or a value differs
      by more than ``atol + rtol * |reference|``; the message names the batch
      size, the output and the difference.
  """
  reference = jax.jit(predict)
  worst = 0.0
  for n, x in inputs.items():
    with jax.default_matmul_precision('highest'):
      want = [np.asarray(a) for a in jax.tree.leaves(reference(x))]
    got = [np.asarray(a) for a in run(x)]
    expect(len(got) == len(want), f'{format} export: number of outputs at batch size {n}',
           len(want), len(got), ExportError)
    for i, (g, w) in enumerate(zip(got, want)):
      expect(g.shape == w.shape and g.dtype == w.dtype,
             f'{format} export: output {i} at batch size {n}', f'{w.dtype}{list(w.shape)}',
             f'{g.dtype}{list(g.shape)}', ExportError)
      diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
      worst = max(worst, float(diff.max(initial=0.0)))
      expect(bool(np.all(diff <= atol + rtol * np.abs(w.astype(np.float64)))),
             f'{format} export: output {i} at batch size {n}',
             f'the in-process predict within atol={atol}, rtol={rtol}',
             f'a max abs difference of {float(diff.max(initial=0.0)):.3g}', ExportError)
  return worst


def host_callbacks(predict: Callable, spec: jax.ShapeDtypeStruct) -> list[str]:
  """Names of the host-callback primitives (``pure_callback``, ...) ``predict`` traces to.

  A serialized artifact cannot hold Python; with a symbolic batch jax fails
  to lower a callback with a bare ``std::bad_cast``, so exporters name them.
  """
  try:
    jaxpr = jax.make_jaxpr(predict)(spec)
  except Exception:   # predict does not even trace: the caller reports the exporter's error
    return []
  names: set[str] = set()

  def walk(j):
    for eqn in j.eqns:
      if 'callback' in eqn.primitive.name:
        names.add(eqn.primitive.name)
      for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
          sub = getattr(sub, 'jaxpr', sub)
          if hasattr(sub, 'eqns'):
            walk(sub)

  walk(jaxpr.jaxpr)
  return sorted(names)


def write_signature(directory: str, signature: dict) -> None:
  """Writes ``signature.json`` (through a temporary name) into ``directory``."""
  safe_files.write_atomic(os.path.join(directory, SIGNATURE), json.dumps(signature, indent=2))


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
  # Each through a fresh temporary and a rename (never through a link); a
  # crash between the two leaves a pair that load_predict refuses (SHA-256).
  safe_files.write_atomic(path, payload)
  write_signature(directory, signature)
  return path


def read_verified(path: str, artifact: str, what: str, *, verify: bool = True
                  ) -> tuple[str, bytes]:
  """``(path, bytes)`` of an artifact (a file, or ``artifact`` in a directory),
  checked against the SHA-256 that ``signature.json`` beside it records.

  The check is required: a missing ``signature.json``, or one without a
  ``sha256``, is an error, not a skipped check. ``verify=False`` waives it
  (the caller vouches for the bytes: an artifact copied without its
  signature).

  Raises:
    DataError: naming ``what``: the file is missing, the signature missing
      or unreadable (with ``verify``), or the bytes differ from it (flipped,
      truncated, replaced).
  """
  if os.path.isdir(path):
    path = os.path.join(path, artifact)
  expect(os.path.isfile(path), what, 'an existing file', repr(path), DataError)
  with open(path, 'rb') as f:
    payload = f.read()
  if not verify:
    return path, payload
  signature_path = os.path.join(os.path.dirname(path), SIGNATURE)
  waive = 'or pass verify=False to load it unchecked'
  try:
    with open(signature_path) as f:
      want = json.load(f).get('sha256')
  except FileNotFoundError:
    raise DataError(f'{what} {path!r}: expected {SIGNATURE} beside it (its SHA-256), got no '
                    f'such file; restore it, {waive}') from None
  except (ValueError, AttributeError, OSError) as e:
    raise DataError(f'{what}: expected a readable {signature_path}, got {e}') from None
  expect(isinstance(want, str), f'{signature_path} sha256', f'the SHA-256 of {artifact} ({waive})',
         repr(want), DataError)
  got = hashlib.sha256(payload).hexdigest()
  expect(want == got, f'{what} {path!r}',
         f'SHA-256 {want} (as {SIGNATURE} records)', f'{got}: the file changed', DataError)
  return path, payload


def load_predict(path: str, *, verify: bool = True) -> Callable[[np.ndarray], jax.Array]:
  """Loads an exported artifact (file or its directory) as ``x -> outputs``.

  The function says what it takes: ``predict.input_shape`` (the per-example
  shape, e.g. ``(8, 8, 1)`` for digits, ``(64,)`` for flat features) and
  ``predict.dtype``, so code that feeds it needs no knowledge of the run.

  Example: an artifact as ``purax export`` writes it for a digits run (here
  of a linear map; a run's is ``task.predict`` with its params baked in):

    >>> from purax.io.export import export_predict, load_predict
    >>> w = np.ones((64, 10), np.float32)
    >>> path = export_predict(lambda x: x.reshape(x.shape[0], -1) @ w, (8, 8, 1),
    ...                       'runs/mine/export')
    >>> predict = load_predict('runs/mine/export')
    >>> predict.input_shape, predict.dtype
    ((8, 8, 1), dtype('float32'))
    >>> x = np.zeros((5, *predict.input_shape), predict.dtype)   # any batch size
    >>> predict(x).shape                                         # [5, num_classes]
    (5, 10)

  Args:
    path: ``predict.jaxexport`` or the directory holding it.
    verify: check the bytes against the SHA-256 in ``signature.json`` beside
      it (required: a missing signature is an error); ``False`` waives it.

  Returns:
    ``predict(x)``: ``x`` ``[batch, *predict.input_shape]`` to the model's
    outputs, with the attributes ``input_shape`` and ``dtype``.

  Raises:
    DataError: the file is missing; with ``verify``, ``signature.json`` or its
      ``sha256`` is missing, or the bytes differ from it (flipped, truncated,
      replaced); the file is not a jax.export artifact; or inputs have the
      wrong per-example shape (naming ``predict.input_shape``).
  """
  path, payload = read_verified(path, ARTIFACT, 'export artifact', verify=verify)
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
           f'[batch, {", ".join(map(str, expected))}] (predict.input_shape)', tuple(x.shape))
    return exported.call(x)

  predict.input_shape, predict.dtype = tuple(int(d) for d in expected), np.dtype(dtype)
  return predict
