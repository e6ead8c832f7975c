"""SavedModel export (purax.io.tf_export): jax2tf, checked by loading it back.

The real path needs TensorFlow (the ``savedmodel`` extra) and is skipped,
with the reason, without it; the missing-TensorFlow error always runs.
"""

import importlib.util
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

needs_tf = pytest.mark.skipif(importlib.util.find_spec('tensorflow') is None,
                              reason="TensorFlow absent (the 'savedmodel' extra)")


def test_without_tensorflow_the_error_names_the_extra(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorflow', None)    # import tensorflow raises ImportError
  with pytest.raises(purax.ConfigError, match=r"savedmodel export: expected TensorFlow "
                                              r"\(pip install 'purax\[savedmodel\]'\)"):
    export(lambda x: x, (3,), str(tmp_path / 'out'), format='savedmodel')
  assert not (tmp_path / 'out').exists()


@needs_tf
def test_the_loaded_savedmodel_equals_predict_at_batch_1_and_7(tmp_path):
  import tensorflow as tf
  task, state, x = trained('cnn')
  _, shape, dtype = MODELS['cnn']
  predict = jax.jit(lambda v: task.predict(state, v))
  out = tmp_path / 'sm'
  for _ in range(2):   # the second export replaces the first, leaving no temporary directory
    assert export(predict, shape, str(out), format='savedmodel', dtype=dtype, inputs=x,
                  metadata={'model': 'cnn'}) == str(out)
  assert sorted(os.listdir(tmp_path)) == ['sm']
  loaded = tf.saved_model.load(str(out))
  serving = loaded.signatures['serving_default']
  for n in (1, 7):
    rows = np.random.default_rng(n).permutation(x)[:n]
    want = np.asarray(predict(rows))
    got = loaded.serve(tf.constant(rows))['outputs'].numpy()
    assert got.shape == want.shape and np.max(np.abs(got - want)) <= 1e-5
    np.testing.assert_array_equal(serving(x=tf.constant(rows))['outputs'].numpy(), got)
  signature = json.loads((out / 'signature.json').read_text())
  assert signature['format'] == 'savedmodel' and signature['model'] == 'cnn'
  assert signature['input']['shape'] == ['batch', *shape]
  assert 0 <= signature['check']['max_abs_diff'] <= 1e-5


@needs_tf
def test_a_function_savedmodel_cannot_express_is_an_export_error(tmp_path):
  """A host callback (named), and a function of the batch size (not batch-polymorphic)."""

  def predict(x):   # a host callback: jax.export serializes no Python
    return jax.pure_callback(lambda a: np.tanh(a), jax.ShapeDtypeStruct(x.shape, x.dtype), x)

  with pytest.raises(ExportError, match=r"savedmodel export of predict: expected a function "
                                        r"jax2tf and TensorFlow can express, got the jax "
                                        r"primitive\(s\) 'pure_callback' \(host callbacks"):
    export(predict, (3,), str(tmp_path / 'out'), format='savedmodel')
  assert os.listdir(tmp_path) == []
  with pytest.raises(ExportError, match=r'savedmodel export of predict: expected .* got '
                                        r'(?!the jax primitive).*batch'):
    export(lambda x: x.reshape(2, -1), (3,), str(tmp_path / 'out'), format='savedmodel')
  assert os.listdir(tmp_path) == []


@needs_tf
def test_a_savedmodel_that_computes_otherwise_is_refused_and_the_old_one_stays(tmp_path,
                                                                               monkeypatch):
  out = tmp_path / 'sm'
  export(lambda x: jnp.tanh(x), (3,), str(out), format='savedmodel')
  before = (out / 'signature.json').read_text()
  from purax.io import export as export_lib
  real = export_lib.compare
  monkeypatch.setattr('purax.io.tf_export.compare',
                      lambda fmt, run, *a, **k: real(fmt, lambda x: [y + 1e-3 for y in run(x)],
                                                     *a, **k))
  with pytest.raises(ExportError, match=r'savedmodel export: output 0 at batch size 1: expected '
                                        r'the in-process predict within atol=1e-05'):
    export(lambda x: 2.0 * jnp.tanh(x), (3,), str(out), format='savedmodel')
  assert sorted(os.listdir(tmp_path)) == ['sm'] and (out / 'signature.json').read_text() == before
  from purax.io.tf_export import _digest     # and the files are those signature.json records
  os.replace(out / 'signature.json', tmp_path / 'signature.json')
  assert _digest(str(out)) == json.loads(before)['sha256']
