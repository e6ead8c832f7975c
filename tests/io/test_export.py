import importlib.util
import os

import numpy as np
import pytest

import purax
from purax.app import runs
from purax.app.config import TrainConfig
from purax.io.export import load_predict


def test_exported_predict_matches_the_model_for_several_batch_sizes(tmp_path):
  workdir = str(tmp_path / 'run')
  runs.train(TrainConfig.of(model='cnn', steps=5, batch_size=16, eval_every=0, workdir=workdir,
                         progress=False))
  path = runs.export_run(workdir)
  job, state = runs.restore_run(workdir)
  ds, task = job.data, job.task
  predict = load_predict(path)          # jax only: no purax model code involved
  for n in (1, 7, 64):
    x = ds.x_test[:n]
    np.testing.assert_allclose(predict(x), task.predict(state, x), rtol=1e-5, atol=1e-6)
  with pytest.raises(purax.DataError, match=r'x.shape: expected \[batch, 8, 8, 1\] '
                                            r'\(predict.input_shape\), got \(2, 64\)'):
    predict(np.zeros((2, 64), np.float32))
  # Issue 29.5: code that feeds it needs no knowledge of the run's data shape.
  assert predict.input_shape == (8, 8, 1) and predict.dtype == np.float32
  x = np.zeros((5, *predict.input_shape), predict.dtype)
  assert predict(x).shape == (5, 10)
  if importlib.util.find_spec('jax2onnx') and importlib.util.find_spec('onnxruntime'):
    from purax.io.onnx_export import load_onnx   # the same run as ONNX (the onnx extra)
    path = runs.export_run(workdir, format='onnx')
    assert path == os.path.join(workdir, 'export-onnx', 'predict.onnx')
    run = load_onnx(path)
    for n in (1, 7):
      x = ds.x_test[:n]
      assert np.max(np.abs(run(x)[0] - task.predict(state, x))) <= 1e-5


def _flip(data):
  data = bytearray(data)
  for i in range(16):
    data[(i * 7919) % len(data)] ^= 0xFF
  return bytes(data)


@pytest.mark.parametrize('damage', ['flipped', 'truncated', 'garbage', 'garbage alone'])
def test_a_damaged_artifact_is_refused_with_a_clear_error(tmp_path, damage):
  """Issue 13.4: never struct.error, never running changed bytes."""
  directory = tmp_path / 'export'
  from purax.io.export import export_predict
  import jax.numpy as jnp
  path = export_predict(lambda x: jnp.tanh(x) * 2.0, (3,), str(directory))
  data = open(path, 'rb').read()
  changed = {'flipped': _flip(data), 'truncated': data[:len(data) // 2],
             'garbage': bytes(range(256)) * 4, 'garbage alone': bytes(range(256)) * 4}[damage]
  with open(path, 'wb') as f:
    f.write(changed)
  if damage == 'garbage alone':     # no signature.json, check waived: the reader still refuses
    (directory / 'signature.json').unlink()
    match = 'expected a jax.export artifact, got bytes it cannot read'
  else:
    match = r'export artifact .*: expected SHA-256 [0-9a-f]{64} .*the file changed'
  with pytest.raises(purax.DataError, match=match):
    load_predict(path, verify=damage != 'garbage alone')


@pytest.mark.parametrize('removed', ['signature.json', 'its sha256'])
def test_a_removed_signature_is_an_error_not_a_skipped_check(tmp_path, removed):
  """Issue 28.2: deleting the signature (or its sha256) must not turn the check
  off and let a swapped artifact load; ``verify=False`` is the explicit waiver."""
  import json
  import jax.numpy as jnp
  from purax.io.export import export_predict
  directory = tmp_path / 'export'
  path = export_predict(lambda x: jnp.tanh(x) * 2.0, (3,), str(directory))
  swapped = export_predict(lambda x: x * 0.0, (3,), str(tmp_path / 'other'))
  with open(path, 'wb') as f:            # another model's bytes in place of this one's
    f.write(open(swapped, 'rb').read())
  signature = directory / 'signature.json'
  if removed == 'signature.json':
    signature.unlink()
    match = r"expected signature.json beside it .*got no such file.*verify=False"
  else:
    body = json.loads(signature.read_text())
    del body['sha256']
    signature.write_text(json.dumps(body))
    match = r"signature.json sha256: expected the SHA-256 of predict.jaxexport .*got None"
  with pytest.raises(purax.DataError, match=match):
    load_predict(path)
  waived = load_predict(path, verify=False)      # the caller vouches for the bytes
  np.testing.assert_array_equal(np.asarray(waived(np.ones((2, 3), np.float32))), 0.0)
