"""Tensor parallel splits the transformer's attention and MLP over 'tensor'
(issue 14, item 10b): checked by layout — the sharding specs and the bytes
each device holds — not by values, which a replicated kernel leaves unchanged.

Megatron (Shoeybi et al. 2019): the fused qkv kernel and the first MLP kernel
are column parallel (heads / hidden split), the output projection and the
second MLP kernel row parallel.
"""

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import purax
from purax import parallel

TENSOR = 4
LM = purax.Task(model=purax.nn.DecoderLM(vocab_size=32, d_model=16, num_layers=2, num_heads=4,
                                         max_len=8, scan_layers=True),
                tx=purax.adamw(learning_rate=1e-3, total_steps=10), loss=purax.objectives.language_model)
ENCODER = purax.Task(model=purax.nn.TransformerEncoder(num_classes=4, d_model=16, num_layers=2,
                                                       num_heads=4, scan_layers=False),
                     tx=purax.adamw(learning_rate=1e-3, total_steps=10))
BATCHES = {'lm': {'x': np.zeros((4, 8), np.int32), 'y': np.zeros((4, 8), np.int32)},
           'encoder': {'x': np.zeros((4, 8, 3), np.float32), 'y': np.zeros((4,), np.int32)}}
# Scanned layers carry a leading [layers] axis (unsplit).
SPLIT = {
    'lm': {('layers', 'attention', 'qkv'): P(None, None, None, 'tensor', None),
           ('layers', 'attention', 'out'): P(None, 'tensor', None, None),
           ('layers', 'mlp', 'wi'): P(None, None, 'tensor'),
           ('layers', 'mlp', 'wo'): P(None, 'tensor', None)},
    'encoder': {(f'layers_{i}', *k): spec for i in range(2) for k, spec in [
        (('attention', 'qkv'), P(None, None, 'tensor', None)),
        (('attention', 'out'), P('tensor', None, None)),
        (('mlp', 'wi'), P(None, 'tensor')),
        (('mlp', 'wo'), P('tensor', None))]},
}


def _get(tree, path):
  for k in path:
    tree = tree[k]
  return tree


@pytest.mark.parametrize('name', ['lm', 'encoder'])
def test_attention_and_mlp_kernels_are_split_over_tensor(name):
  task = {'lm': LM, 'encoder': ENCODER}[name]
  mesh = parallel.make_mesh(data=2, tensor=TENSOR)
  plan = parallel.sharded(task, mesh, parallel.tensor_parallel(), BATCHES[name])
  state = plan.init(jax.random.key(0))
  moments = [optax.tree_utils.tree_get(state.opt_state, k) for k in ('mu', 'nu')]   # Adam's
  for path, spec in SPLIT[name].items():
    where = '/'.join(path)
    assert _get(plan.state_sharding.params, path).spec == spec, where
    for tree in (state.params, *moments):
      leaf = _get(tree, path)
      held = parallel.bytes_per_device(leaf)
      assert len(held) == len(mesh.devices.flat)
      assert set(held.values()) == {leaf.nbytes // TENSOR}, where   # a quarter on each device
  if name == 'lm':   # the layout survives a step
    state, _ = plan.step(state, plan.shard_batch(BATCHES[name]))
    for path in SPLIT[name]:
      assert set(parallel.bytes_per_device(_get(state.params, path)).values()) == \
          {_get(state.params, path).nbytes // TENSOR}
