"""The configurations purax.plan.fit_memory compiles (purax.plan.candidates):
microbatches that divide the batch, one for a model with batch statistics,
remat only for a model with a remat field, FSDP on a mesh, a candidate's
precision; bad choices are named. Choosing among them: tests/plan/test_memory.py."""

import jax
import pytest

import purax
from purax import parallel
from purax.plan import candidates as candidates_lib
from purax.plan.candidates import Candidate
from tests.helpers import tiny_batch, tiny_task


def test_the_candidates_leave_out_what_changes_the_math_unless_asked():
  """Cheap (traces only): microbatches that divide the batch (and its share per
  batch device), one for a model with batch statistics, remat only for a model
  with a remat field; bad choices are named."""
  batch = tiny_batch(8)
  mlp = tiny_task('mlp')
  assert [c.microbatches for c in candidates_lib.candidates(mlp, batch)] == [1, 2, 4, 8]
  mesh = parallel.make_mesh(data=4, fsdp=2)
  got = candidates_lib.candidates(mlp, batch, mesh=mesh)
  assert [(c.microbatches, c.fsdp) for c in got] == [(1, False), (1, True)]
  resnet = candidates_lib.candidates(tiny_task('resnet'), batch)     # BatchNorm
  assert {c.microbatches for c in resnet} == {1}
  assert [c.remat for c in resnet] == list(candidates_lib.REMAT)
  allowed = candidates_lib.candidates(tiny_task('resnet'), batch, microbatches=(2, 1))
  assert [(c.remat, c.microbatches) for c in allowed][:3] == [
      ('none', 1), ('none', 2), ('dots_with_no_batch_dims_saveable', 1)]
  with pytest.raises(purax.ConfigError, match=r'remat: expected None for MLP \(it has no remat'):
    candidates_lib.candidates(mlp, batch, remat=('full',))
  with pytest.raises(purax.ConfigError, match='microbatches: expected counts that divide the '
                     'batch of 8'):
    candidates_lib.candidates(mlp, batch, microbatches=(3,))
  with pytest.raises(purax.ConfigError, match='precision'):
    candidates_lib.candidates(mlp, batch, precision=('fp64x',))
  bf16 = Candidate(precision='bf16').task(mlp)
  assert bf16.model.dtype == jax.numpy.bfloat16 and bf16.loss_scale is None
  assert Candidate(precision='fp16').task(mlp).loss_scale == candidates_lib.LOSS_SCALE
