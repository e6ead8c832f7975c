import jax
import numpy as np
import pytest

import purax
from purax import runs
from purax.config import TrainConfig
from purax.io.export import load_predict


def test_exported_predict_matches_the_model_for_several_batch_sizes(tmp_path):
  workdir = str(tmp_path / 'run')
  runs.train(TrainConfig(model='cnn', steps=5, batch_size=16, eval_every=0, workdir=workdir,
                         progress=False))
  path = runs.export_run(workdir)
  _, ds, task, state = runs.restore_run(workdir)
  predict = load_predict(path)          # jax only: no purax model code involved
  for n in (1, 7, 64):
    x = ds.x_test[:n]
    np.testing.assert_allclose(predict(x), task.predict(state, x), rtol=1e-5, atol=1e-6)
  with pytest.raises(purax.DataError, match=r'x.shape: expected \[batch, 8, 8, 1\], got \(2, 64\)'):
    predict(np.zeros((2, 64), np.float32))
