"""TensorFlow SavedModel export of a predict function through jax2tf, checked by loading it back.

``export_savedmodel`` wraps ``predict`` (parameters closed over: they are
embedded in the serialized StableHLO, so the whole model must stay under
protobuf's 2 GiB) with ``jax2tf.convert`` and a ``tf.function`` whose input
signature is ``[None, *input_shape]`` (a symbolic batch), saves it,
loads the saved copy back with ``tf.saved_model.load``, runs it at batch
sizes 1 and 7 against the in-process ``predict``, and only then moves it to
``directory``. The concrete function is ``loaded.serve`` (also the
``serving_default`` signature, input ``x``, output ``outputs``).

Needs TensorFlow: ``pip install 'purax[savedmodel]'`` (tensorflow-cpu; it
pins nothing of jax, flax or orbax).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from purax.core.errors import ConfigError, PuraxError
from purax.io.export import (ExportError, check_inputs, check_shape, compare, host_callbacks,
                             write_signature)

INSTALL = "pip install 'purax[savedmodel]'"


def _require():
  """Imports TensorFlow and jax2tf, or a ConfigError naming the extra."""
  try:
    import tensorflow as tf
    from jax.experimental import jax2tf
  except ImportError as e:
    raise ConfigError(f'savedmodel export: expected TensorFlow ({INSTALL}), got {e}') from e
  return tf, jax2tf


def _digest(directory: str) -> str:
  """SHA-256 over the SavedModel's files (relative path and bytes, sorted)."""
  h = hashlib.sha256()
  for root, _, files in sorted(os.walk(directory)):
    for name in sorted(files):
      path = os.path.join(root, name)
      h.update(os.path.relpath(path, directory).encode() + b'\0')
      with open(path, 'rb') as f:
        h.update(hashlib.sha256(f.read()).digest())
  return h.hexdigest()


def export_savedmodel(predict: Callable[[jax.Array], jax.Array], input_shape: Sequence[int],
                      directory: str, *, dtype=jnp.float32, inputs: np.ndarray | None = None,
                      atol: float = 1e-5, rtol: float = 1e-5,
                      platforms: Sequence[str] = ('cpu',),
                      metadata: dict | None = None) -> str:
  """Exports ``predict`` (``[batch, *input_shape] -> outputs``) as a SavedModel in ``directory``.

  Args:
    predict: a pure function of the inputs only (close over the parameters).
    input_shape: the per-example shape; the batch is symbolic.
    directory: becomes the SavedModel directory (``saved_model.pb``,
      ``variables/``) with ``signature.json`` beside its files. Written and
      checked in a temporary sibling, then renamed, so a failure leaves no
      partial or unchecked SavedModel (a previous one stays).
    dtype: the input dtype.
    inputs: ``[m, *input_shape]`` rows for the check; None: standard normal
      floats or 0/1 integers.
    atol, rtol: the check's tolerance (``|tf - predict| <= atol + rtol * |predict|``).
    platforms: where the embedded StableHLO may run (``jax2tf``'s
      ``native_serialization_platforms``); ``'cpu'`` by default, which the
      check needs on a machine whose TensorFlow has no GPU.
    metadata: extra JSON for ``signature.json``.

  Returns:
    ``directory``.

  Raises:
    ConfigError: TensorFlow is not installed (the message names the extra),
      or a bad ``input_shape`` / ``inputs``.
    ExportError: jax2tf or TensorFlow cannot express or save ``predict``
      (the message carries theirs), or the loaded SavedModel's outputs differ
      from ``predict``'s at batch size 1 or 7.
  """
  tf, jax2tf = _require()
  input_shape = check_shape(input_shape)
  checks = check_inputs(inputs, input_shape, dtype)
  parent = os.path.dirname(os.path.abspath(directory))
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix='.savedmodel-', dir=parent)
  try:
    try:
      converted = jax2tf.convert(predict, polymorphic_shapes=['(batch, ...)'],
                                 with_gradient=False,
                                 native_serialization_platforms=tuple(platforms))
      module = tf.Module()
      module.serve = tf.function(
          lambda x: {'outputs': converted(x)}, autograph=False, jit_compile=False,
          input_signature=[tf.TensorSpec((None, *input_shape), tf.as_dtype(np.dtype(dtype)),
                                         name='x')])
      tf.saved_model.save(module, staging,
                          signatures={'serving_default': module.serve.get_concrete_function()})
    except PuraxError:   # predict's own validation (a wrong input shape): as raised
      raise
    except Exception as e:   # jax's export errors and TensorFlow's own classes alike
      (batch,) = jax.export.symbolic_shape('batch')
      callbacks = host_callbacks(predict, jax.ShapeDtypeStruct((batch, *input_shape), dtype))
      got = (f"the jax primitive(s) {', '.join(map(repr, callbacks))} (host callbacks: a "
             f"SavedModel cannot hold Python)" if callbacks else '')
      raise ExportError(f'savedmodel export of predict: expected a function jax2tf and '
                        f'TensorFlow can express, got {got or ""}{"; " if got else ""}'
                        f'{type(e).__name__}: {e}') from e
    loaded = tf.saved_model.load(staging)
    worst = compare('savedmodel',
                    lambda x: [np.asarray(a) for a in jax.tree.leaves(
                        loaded.serve(tf.constant(x))['outputs'])],
                    predict, checks, atol=atol, rtol=rtol)
    signature = {'format': 'savedmodel', 'function': 'serve (serving_default)',
                 'input': {'name': 'x', 'shape': ['batch', *input_shape],
                           'dtype': str(np.dtype(dtype))},
                 'platforms': list(platforms),
                 'check': {'batch_sizes': list(checks), 'max_abs_diff': worst,
                           'atol': atol, 'rtol': rtol},
                 'tensorflow': tf.__version__,
                 'sha256': _digest(staging), **(metadata or {})}
    write_signature(staging, signature)
    old = None
    if os.path.exists(directory):
      old = tempfile.mkdtemp(prefix='.savedmodel-old-', dir=parent)
      os.replace(directory, os.path.join(old, 'previous'))
    os.replace(staging, directory)
    if old is not None:
      shutil.rmtree(old, ignore_errors=True)
  finally:
    if os.path.exists(staging):
      shutil.rmtree(staging, ignore_errors=True)
  return directory
