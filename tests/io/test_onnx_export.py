"""ONNX export (purax.io.onnx_export): onnxruntime equals the in-process predict.

The CNN, the ResNet and the decoder LM, with random weights and BatchNorm
statistics (not their initial values), exported
with a symbolic batch and run by onnxruntime at batch sizes 1 and 7: max abs
difference <= 1e-5 in float32 (issue 16). Needs the ``onnx`` extra and
jax2onnx (``pip install --no-deps``, see the README); without them only the
missing-extra error is tested here.
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purax
from purax.io.export import ExportError, export
from tests.helpers_export import MODELS, trained

onnx_installed = all(
  __import__('importlib').util.find_spec(m) is not None for m in ('jax2onnx', 'onnxruntime'))
needs_onnx = pytest.mark.skipif(not onnx_installed,
                                reason="jax2onnx/onnxruntime absent (the 'onnx' extra)")


@needs_onnx
@pytest.mark.parametrize('name', list(MODELS))
def test_onnxruntime_equals_predict_at_batch_1_and_7(tmp_path, name):
  import onnx
  from purax.io.onnx_export import load_onnx
  task, state, x = trained(name)
  _, shape, dtype = MODELS[name]
  predict = jax.jit(lambda v: task.predict(state, v))
  path = export(predict, shape, str(tmp_path), format='onnx', dtype=dtype, inputs=x,
                metadata={'model': name})
  assert path == str(tmp_path / 'predict.onnx')
  (graph_input,) = onnx.load(path).graph.input       # the batch is symbolic, the rest fixed
  dims = graph_input.type.tensor_type.shape.dim
  assert dims[0].dim_param == 'batch' and [d.dim_value for d in dims[1:]] == list(shape)
  run = load_onnx(str(tmp_path))                     # a fresh onnxruntime session, no jax
  for n in (1, 7):
    rows = np.random.default_rng(n).permutation(x)[:n]
    (got,) = run(rows)
    want = np.asarray(predict(rows))
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.max(np.abs(got - want)) <= 1e-5
  signature = json.loads((tmp_path / 'signature.json').read_text())
  assert signature['format'] == 'onnx' and signature['model'] == name
  assert signature['input'] == {'name': 'x', 'shape': ['batch', *shape],
                                'dtype': np.dtype(dtype).name}
  assert signature['check']['batch_sizes'] == [1, 7]
  assert 0 <= signature['check']['max_abs_diff'] <= 1e-5


@needs_onnx
def test_an_op_onnx_cannot_express_is_named_and_nothing_is_written(tmp_path):
  """A host callback (named), and a function of the batch size (not batch-polymorphic)."""

  def predict(x):   # a host callback: no ONNX op can run Python
    return jax.pure_callback(lambda a: np.tanh(a), jax.ShapeDtypeStruct(x.shape, x.dtype), x)

  with pytest.raises(ExportError, match=r"onnx export of predict: expected ops ONNX can "
                                        r"express, got the jax primitive 'pure_callback'"):
    export(predict, (3,), str(tmp_path / 'out'), format='onnx')
  with pytest.raises(ExportError, match=r'onnx export of predict: expected ops ONNX can express, '
                                        r'got a computation that needs a concrete batch size'):
    export(lambda x: x.reshape(2, -1), (3,), str(tmp_path / 'out'), format='onnx')
  assert not (tmp_path / 'out').exists()


@needs_onnx
def test_an_artifact_that_computes_otherwise_is_refused_before_it_is_written(tmp_path,
                                                                            monkeypatch):
  from purax.io import onnx_export
  real = onnx_export._session

  class Off:   # onnxruntime's answers, 1e-3 off
    def __init__(self, session):
      self.session = session

    def __getattr__(self, name):
      return getattr(self.session, name)

    def run(self, names, feeds):
      return [y + np.float32(1e-3) for y in self.session.run(names, feeds)]

  monkeypatch.setattr(onnx_export, '_session', lambda ort, payload: Off(real(ort, payload)))
  with pytest.raises(ExportError, match=r'onnx export: output 0 at batch size 1: expected the '
                                        r'in-process predict within atol=1e-05, rtol=1e-05, '
                                        r'got a max abs difference of 0.001'):
    export(lambda x: jnp.tanh(x) * 2.0, (3,), str(tmp_path), format='onnx')
  assert os.listdir(tmp_path) == []


@needs_onnx
def test_load_onnx_refuses_a_changed_file_and_a_wrong_shape(tmp_path):
  from purax.io.onnx_export import load_onnx
  path = export(lambda x: jnp.tanh(x) * 2.0, (3,), str(tmp_path), format='onnx')
  run = load_onnx(path)
  np.testing.assert_allclose(run(np.ones((2, 3), np.float32))[0], np.tanh(np.ones((2, 3))) * 2,
                             rtol=1e-6)
  with pytest.raises(purax.DataError, match=r'x.shape: expected \[batch, 3\], got \(2, 4\)'):
    run(np.zeros((2, 4), np.float32))
  data = bytearray(open(path, 'rb').read())
  data[len(data) // 2] ^= 0xFF
  with open(path, 'wb') as f:
    f.write(bytes(data))
  with pytest.raises(purax.DataError, match=r'onnx artifact .*: expected SHA-256 [0-9a-f]{64} '
                                            r'.*the file changed'):
    load_onnx(path)


def test_without_the_extra_the_error_names_it(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'jax2onnx', None)    # import jax2onnx raises ImportError
  with pytest.raises(purax.ConfigError, match=r"onnx export: expected jax2onnx, onnx and "
                                              r"onnxruntime \(pip install 'purax\[onnx\]'"):
    export(lambda x: x, (3,), str(tmp_path / 'out'), format='onnx')
  assert not (tmp_path / 'out').exists()


def test_an_unknown_format_or_input_shape_is_refused(tmp_path):
  with pytest.raises(purax.ConfigError, match=r"export format: expected 'jax' or 'onnx' or "
                                              r"'savedmodel', got 'tflite'"):
    export(lambda x: x, (3,), str(tmp_path), format='tflite')
  from purax.io.export import check_inputs, check_shape
  with pytest.raises(purax.ConfigError, match=r'input_shape: expected positive integers .*, '
                                              r'got \(3, 0\)'):
    check_shape((3, 0))
  with pytest.raises(purax.ConfigError, match=r'check_inputs.shape: expected \[n >= 1, 3\], '
                                              r'got \(2, 4\)'):
    check_inputs(np.zeros((2, 4)), (3,), np.float32)
