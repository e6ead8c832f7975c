"""Muon on the DecoderLM (issue 46.2): an FSDP mesh steps as one device does,
unrolled and scanned, with the attention and MLP kernels split over the mesh
and orthogonalised (purax.core.muon's table)."""

import jax
import numpy as np
import pytest

import purax
from purax import parallel, testing
from purax.core import optimizers


def lm_task(scan):
  return purax.Task(model=purax.nn.DecoderLM(vocab_size=64, d_model=32, num_layers=2,
                                               num_heads=4, max_len=16, scan_layers=scan),
                    tx=optimizers.muon(learning_rate=2e-2, total_steps=10),
                    loss=purax.objectives.language_model)


def lm_batches(n=3, batch=8, seq=16):
  rng = np.random.default_rng(0)
  out = []
  for _ in range(n):
    window = rng.integers(0, 64, size=(batch, seq + 1)).astype(np.int32)
    out.append({'x': window[:, :-1], 'y': window[:, 1:]})
  return out


@pytest.mark.parametrize('scan', [False, True], ids=['unrolled', 'scanned'])
def test_muon_on_the_decoder_lm_on_an_fsdp_mesh_equals_one_device(scan):
  """fsdp=8 splits every attention and MLP kernel (and the embedding); the
  state after 3 steps equals one device's within testing.TOLERANCES (lr
  2e-2 widening the params' by 2 * lr per step for the AdamW leaves'
  gradient entries that are rounding noise). The Newton-Schulz products of a
  split matrix are partial sums all-reduced over the mesh: not bitwise."""
  task = lm_task(scan)
  batches = lm_batches()
  mesh = testing.mesh_of({'data': 1, 'fsdp': 8, 'tensor': 1})
  rules = parallel.fsdp(min_size=1024)
  plan = parallel.sharded(task, mesh, rules, batches[0])
  params = plan.state_sharding.params
  rows = optimizers.muon_leaves(jax.eval_shape(task.init, jax.random.key(0), batches[0]).params)
  muon = [r.path for r in rows if r.part == 'muon']
  assert len(muon) == (4 if scan else 8)
  split = {jax.tree_util.keystr(p, simple=True, separator='/')
           for p, s in jax.tree_util.tree_leaves_with_path(params) if 'fsdp' in str(s.spec)}
  assert set(muon) <= split, set(muon) - split
  with jax.default_matmul_precision('highest'):
    testing.assert_step_matches_single_device(task, mesh, rules, batches, learning_rate='auto')
