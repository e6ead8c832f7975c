"""ONNX export of a predict function through jax2onnx, checked by onnxruntime.

``export_onnx`` converts ``predict`` (parameters closed over, so they become
the graph's initializers) to an ONNX model whose input is ``[batch,
*input_shape]`` with ``batch`` symbolic (``dim_param 'batch'``), runs it with
onnxruntime at batch sizes 1 and 7 against the in-process ``predict``, and
only then writes ``predict.onnx`` and ``signature.json`` (SHA-256, shapes,
dtypes, the measured difference). ``load_onnx`` runs the file with
onnxruntime alone.

Needs the ``onnx`` extra: ``pip install 'purax[onnx]'`` and then
``pip install --no-deps 'jax2onnx>=0.17.1,<0.18'`` (jax2onnx's own metadata
pins orbax-checkpoint below 0.11.37, which nothing it imports at conversion
uses; see the README).

Two jax2onnx 0.17 rewrites are switched off while ``predict`` is traced, so
the graph is converted from the primitives jax itself traces:
``jax.numpy.shape`` (jax2onnx returns a traced array, which breaks
``flax.linen.scan``: the LM's scanned layers) and ``flax.linen.max_pool``
(its replacement refuses ``window_shape`` passed by position, as
:class:`purax.nn.CNN` does; flax's own ``max_pool`` is ``lax.reduce_window``
with ``max``, which jax2onnx converts to ONNX ``MaxPool``). Both are
numerically the functions jax runs; the onnxruntime check holds them to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import logging
import os
import re
from typing import Callable, Sequence

import flax.linen
import flax.linen.pooling
import jax
import jax.numpy as jnp
import numpy as np

from purax.core.errors import ConfigError, DataError, PuraxError, expect
from purax.io import safe_files
from purax.io.export import (ExportError, check_inputs,
                             check_shape, compare, read_verified, write_signature)

ARTIFACT = 'predict.onnx'
#: ONNX opset the graphs target (jax2onnx 0.17's default; onnxruntime >= 1.20 runs it).
OPSET = 23
#: protobuf refuses to serialize a message of 2 GiB or more.
MAX_BYTES = 2 ** 31 - 1
INSTALL = ("pip install 'purax[onnx]' && pip install --no-deps 'jax2onnx>=0.17.1,<0.18'")

# jax's and flax's own functions, captured at import (jax2onnx patches them
# only inside to_onnx).
_ORIGINALS = ((jax.numpy, 'shape', jnp.shape),
              (flax.linen, 'max_pool', flax.linen.pooling.max_pool),
              (flax.linen.pooling, 'max_pool', flax.linen.pooling.max_pool))


def _require():
  """Imports jax2onnx, onnx and onnxruntime, or a ConfigError naming the extra."""
  try:
    import jax2onnx
    import onnx
    import onnxruntime
  except ImportError as e:
    raise ConfigError(f'onnx export: expected jax2onnx, onnx and onnxruntime ({INSTALL}), '
                      f'got {e}') from e
  return jax2onnx, onnx, onnxruntime


def _import_plugins() -> None:
  """Registers jax2onnx's converters for jax, flax and the ONNX ops, once per process.

  jax2onnx imports every module under ``jax2onnx/plugins`` on its first
  conversion; the ``equinox`` and ``examples`` ones build and compile
  Equinox models at import (~20 s on two busy cores, equinox installed).
  Neither is needed to convert: an Equinox model traces to the jax
  primitives the others convert. So they are left out, and jax2onnx's
  import-everything step is marked done (``_already_imported_plugins``, a
  module global of jax2onnx 0.17; absent in another layout, which then
  imports everything as before).
  """
  import importlib
  import pathlib
  from jax2onnx.plugins import plugin_system
  if getattr(plugin_system, '_already_imported_plugins', True):
    return
  root = pathlib.Path(plugin_system.__file__).parent
  for py in sorted(root.rglob('*.py')):
    parts = py.relative_to(root).with_suffix('').parts
    if parts[0] in ('equinox', 'examples') or py.name in ('__init__.py', 'plugin_system.py'):
      continue
    try:
      importlib.import_module('.'.join(('jax2onnx.plugins', *parts)))
    except ImportError:   # a plugin for a library not installed (dm_pix): nothing to convert
      pass
  plugin_system._already_imported_plugins = True


@contextlib.contextmanager
def _quiet(name: str, level: int = logging.ERROR):
  """Raises a library logger's level for the duration (restored after)."""
  logger = logging.getLogger(name)
  saved = logger.level
  logger.setLevel(level)
  try:
    yield
  finally:
    logger.setLevel(saved)


@contextlib.contextmanager
def _jax_semantics():
  """Puts jax's ``jnp.shape`` and flax's ``max_pool`` back while ``predict`` traces."""
  saved = [(module, name, getattr(module, name)) for module, name, _ in _ORIGINALS]
  for module, name, original in _ORIGINALS:
    setattr(module, name, original)
  try:
    yield
  finally:
    for module, name, value in saved:
      setattr(module, name, value)


def _session(onnxruntime, payload: bytes):
  options = onnxruntime.SessionOptions()
  options.log_severity_level = 3    # no warnings about initializers jax2onnx left unused
  return onnxruntime.InferenceSession(payload, options, providers=['CPUExecutionProvider'])


def _unsupported(e: Exception) -> str:
  """The op named in a jax2onnx failure, as the error message's 'got' part."""
  if isinstance(e, jax.errors.InconclusiveDimensionOperation):
    return (f'a computation that needs a concrete batch size (the batch is symbolic): '
            f'{type(e).__name__}: {e}')
  match = re.search(r"primitive '([^']+)'", str(e))
  op = f"the jax primitive '{match.group(1)}'" if match else 'an op'
  return f'{op} that ONNX (jax2onnx) cannot express: {type(e).__name__}: {e}'


def export_onnx(predict: Callable[[jax.Array], jax.Array], input_shape: Sequence[int],
                directory: str, *, dtype=jnp.float32, inputs: np.ndarray | None = None,
                atol: float = 1e-5, rtol: float = 1e-5, opset: int = OPSET,
                metadata: dict | None = None) -> str:
  """Exports ``predict`` (``[batch, *input_shape] -> outputs``) as ONNX to ``directory``.

  Args:
    predict: a pure function of the inputs only (close over the parameters);
      inference mode (no dropout, running BatchNorm statistics).
    input_shape: the per-example shape, e.g. ``(8, 8, 1)``; the batch is
      symbolic.
    directory: receives ``predict.onnx`` and ``signature.json``, written to
      temporary names and renamed after the check, so a failure leaves no
      partial or unchecked artifact.
    dtype: the input dtype (int32 token ids for a language model).
    inputs: ``[m, *input_shape]`` rows for the onnxruntime check (repeated up
      to batch size 7); None: standard normal floats, or 0/1 integers.
    atol, rtol: the check's tolerance, ``|onnx - predict| <= atol + rtol *
      |predict|`` elementwise (float32 runs differ by ~1e-7 on the CNN, the
      ResNet and the LM).
    opset: the ONNX opset.
    metadata: extra JSON for ``signature.json``.

  Returns:
    The path of ``predict.onnx``.

  Raises:
    ConfigError: jax2onnx, onnx or onnxruntime missing (the message gives the
      install command), or a bad ``input_shape`` / ``inputs``.
    ExportError: ``predict`` uses an op ONNX cannot express (named), the graph
      exceeds protobuf's 2 GiB, onnxruntime cannot load it, or its outputs
      differ from ``predict``'s at batch size 1 or 7 beyond the tolerance.
  """
  jax2onnx, onnx, onnxruntime = _require()
  _import_plugins()
  input_shape = check_shape(input_shape)
  checks = check_inputs(inputs, input_shape, dtype)

  def traced(x):
    with _jax_semantics():
      return predict(x)

  spec = jax.ShapeDtypeStruct(('batch', *input_shape), dtype)
  try:
    # onnx_ir warns, per reshape of the CNN, that it leaves a shape tensor's
    # value_info untyped: nothing the graph needs (onnxruntime infers it).
    # jax2onnx's flax Conv adds its bias by rank promotion, which a
    # jax_numpy_rank_promotion='raise' setting would refuse.
    with _quiet('onnx_ir.serde'), jax.numpy_rank_promotion('allow'):
        model = jax2onnx.to_onnx(traced, [spec], model_name='purax_predict', opset=opset,
                               input_names=['x'])
  except (NotImplementedError, TypeError, ValueError,
          jax.errors.InconclusiveDimensionOperation) as e:
    # jax2onnx's "No plugins registered for primitive ..." and the shape and
    # dtype errors of its lowerings, and jax's for code that is not
    # polymorphic in the batch; a purax error raised by predict itself (a
    # ValueError subclass) passes through unchanged.
    if isinstance(e, PuraxError):
      raise
    raise ExportError(f'onnx export of predict: expected ops ONNX can express, got '
                      f'{_unsupported(e)}') from e
  size = model.ByteSize()
  expect(size <= MAX_BYTES, 'onnx export: graph size', 'under 2 GiB (protobuf limit)',
         f'{size} bytes', ExportError)
  payload = model.SerializeToString()
  try:
    session = _session(onnxruntime, payload)
  except Exception as e:   # onnxruntime's own error classes (Fail, InvalidGraph, ...)
    raise ExportError(f'onnx export: expected a graph onnxruntime can load, got '
                      f'{type(e).__name__}: {e}') from e
  (x_info,) = session.get_inputs()
  worst = compare('onnx', lambda x: session.run(None, {x_info.name: x}), predict, checks,
                  atol=atol, rtol=rtol)

  outputs = [{'shape': ['batch' if not isinstance(d, int) else d for d in o.shape],
              'type': o.type} for o in session.get_outputs()]
  signature = {'format': 'onnx', 'opset': opset,
               'input': {'name': x_info.name, 'shape': ['batch', *input_shape],
                         'dtype': str(np.dtype(dtype))},
               'outputs': outputs,
               'check': {'batch_sizes': list(checks), 'max_abs_diff': worst,
                         'atol': atol, 'rtol': rtol},
               'jax2onnx': importlib.metadata.version('jax2onnx'),
               'sha256': hashlib.sha256(payload).hexdigest(), **(metadata or {})}
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, ARTIFACT)
  safe_files.write_atomic(path, payload)
  write_signature(directory, signature)
  return path


def load_onnx(path: str, *, verify: bool = True) -> Callable[[np.ndarray], list[np.ndarray]]:
  """Loads ``predict.onnx`` (file or its directory) as ``x -> [outputs]`` on onnxruntime.

  ``verify`` as in :func:`purax.io.export.load_predict` (required SHA-256;
  ``False`` waives it).

  Raises:
    ConfigError: onnxruntime is not installed.
    DataError: the file is missing; with ``verify``, ``signature.json`` or its
      ``sha256`` is missing or the bytes differ from it; or inputs have the
      wrong per-example shape.
  """
  _, _, onnxruntime = _require()
  path, payload = read_verified(path, ARTIFACT, 'onnx artifact', verify=verify)
  try:
    session = _session(onnxruntime, payload)
  except Exception as e:   # onnxruntime's own error classes for a file that is no model
    raise DataError(f'onnx artifact {path!r}: expected an ONNX model, got '
                    f'{type(e).__name__}: {e}') from None
  (x_info,) = session.get_inputs()
  expected = tuple(x_info.shape[1:])
  dtype = {'tensor(float)': np.float32, 'tensor(int32)': np.int32, 'tensor(int64)': np.int64,
           'tensor(double)': np.float64, 'tensor(bool)': np.bool_}.get(x_info.type)

  def run(x):
    x = np.asarray(x, dtype)
    expect(tuple(x.shape[1:]) == expected, 'x.shape',
           f'[batch, {", ".join(map(str, expected))}]', tuple(x.shape))
    return session.run(None, {x_info.name: x})

  return run
