"""Muon on the matrices it is meant for (issue 46.2): the leaf table of
purax.core.muon, the update each part really applies, and the scanned
DecoderLM stepping as the unrolled one does."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import purax
from purax.core import muon as muon_lib
from purax.core import optim, optimizers
from purax.nn.transformer import DecoderLM

LR = 0.02


def lm(scan):
  return DecoderLM(vocab_size=64, d_model=32, num_layers=3, num_heads=4, max_len=16,
                   scan_layers=scan)


def lm_batch(seed=0, n=4, seq=16):
  window = np.random.default_rng(seed).integers(0, 40, size=(n, seq + 1)).astype(np.int32)
  return {'x': window[:, :-1], 'y': window[:, 1:]}


def stacked(unrolled, num_layers):
  """The unrolled params (``layers_{i}``) in the scanned layout (``layers``, [L, ...])."""
  layers = [unrolled[f'layers_{i}'] for i in range(num_layers)]
  rest = {k: v for k, v in unrolled.items() if not k.startswith('layers_')}
  return {**rest, 'layers': jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}


def grads_of(model, params, batch):
  def loss(p):
    logits = model.apply({'params': p}, batch['x'])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch['y']).mean()
  return jax.jit(jax.grad(loss))(params)


@pytest.fixture(scope='module')
def unrolled_params():
  return nn.meta.unbox(jax.jit(lm(False).init)(jax.random.key(0), lm_batch()['x'])['params'])


def kernels(rows, part):
  return {r.path for r in rows if r.part == part}


@pytest.mark.parametrize('scan', [False, True], ids=['unrolled', 'scanned'])
def test_every_attention_and_mlp_kernel_is_orthogonalised_and_embedding_and_norms_are_not(
    scan, unrolled_params):
  """The table: every qkv, out, wi, wo kernel on Muon (scanned: the layer axis
  a batch axis), the tied embedding (the head) and every norm and bias on
  AdamW. And the update applied: the largest singular value of each Muon
  matrix (per layer, per q/k/v) is that of 5 Newton-Schulz iterations
  (within [0.6, 1.3] of lr * width scale; a gradient of rank below the
  matrix's keeps some small ones; an Adam step, ~lr * sign(g), has a largest
  one ~ (sqrt(rows) + sqrt(cols)) * lr, 11 lr here); each AdamW leaf moves by
  Nesterov Adam's first step, the same magnitude on every entry with a
  gradient."""
  params = stacked(unrolled_params, 3) if scan else unrolled_params
  rows = optimizers.muon_leaves(params)
  names = ('attention/qkv', 'attention/out', 'mlp/wi', 'mlp/wo')
  layers = ['layers'] if scan else [f'layers_{i}' for i in range(3)]
  assert kernels(rows, 'muon') == {f'{l}/{n}' for l in layers for n in names}
  assert 'embed/embedding' in kernels(rows, 'adamw')
  by_path = {r.path: r for r in rows}
  lead = 1 if scan else 0
  assert by_path[f'{layers[0]}/attention/qkv'].batch == ((0, 2) if scan else (1,))
  assert by_path[f'{layers[0]}/attention/out'].reduction == (lead, lead + 1)

  tx = optimizers.muon(learning_rate=LR, total_steps=10**6, clip_norm=1e30)
  grads = grads_of(lm(scan), params, lm_batch())
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  flat = {r.path: u for r, u in zip(rows, jax.tree.leaves(updates))}
  for row in rows:
    u = np.asarray(flat[row.path], np.float64)
    if row.part == 'muon':
      fan_in = np.prod([u.shape[a] for a in row.reduction])
      fan_out = np.prod([u.shape[a] for a in row.output])
      matrices = u.transpose(row.batch + row.reduction + row.output).reshape(-1, fan_in,
                                                                             fan_out)
      scale = LR * np.sqrt(max(1, fan_out / fan_in))    # Jordan's width scale
      for m in matrices:
        s = np.linalg.svd(m, compute_uv=False) / scale
        assert 0.6 < s.max() < 1.3, (row.path, s.max())
    else:
      g = np.asarray(jax.tree.leaves(grads)[rows.index(row)])
      moved = np.abs(u[np.abs(g) > 1e-5])   # eps (1e-8) matters below
      nadam = LR * (1 + 0.9 / 1.9)     # Nesterov Adam's first step: (1 + b1/(1+b1)) sign(g)
      np.testing.assert_allclose(moved, nadam, rtol=1e-3, err_msg=row.path)


def test_the_scanned_decoder_lm_takes_the_unrolled_step_to_float32_rounding(unrolled_params):
  """The same params in both layouts and the same gradients (the unrolled
  model's, stacked for the scanned layout: the two models' own gradients
  differ by rounding, which Adam amplifies on the key bias, whose gradient is
  structurally 0), three optimizer updates: the scanned stack's update of
  layer i equals the unrolled layer i's within rtol 1e-5, atol 1e-7 of
  updates ~1e-2 (float32 rounding of the batched against the separate
  Newton-Schulz products, at highest matmul precision), every leaf."""
  tx = optimizers.muon(learning_rate=LR, total_steps=100, weight_decay=0.1)
  update = jax.jit(tx.update)
  p1, p2 = unrolled_params, stacked(unrolled_params, 3)
  s1, s2 = tx.init(p1), tx.init(p2)
  with jax.default_matmul_precision('highest'):
    for step in range(3):
      g = grads_of(lm(False), p1, lm_batch(step))
      u1, s1 = update(g, s1, p1)
      u2, s2 = update(stacked(g, 3), s2, p2)
      want = stacked(u1, 3)
      for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(u2), jax.tree.leaves(want)):
        assert np.abs(np.asarray(b)).max() > 0
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7,
                                   err_msg=f'step {step} {jax.tree_util.keystr(path)}')
      p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
  # The models agree too: the scanned model at the stacked params gives the
  # unrolled model's gradients (to rounding; the structurally-zero key bias aside).
  g1, g2 = grads_of(lm(False), p1, lm_batch(9)), grads_of(lm(True), p2, lm_batch(9))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g2),
                          jax.tree.leaves(stacked(g1, 3))):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6, err_msg=jax.tree_util.keystr(path))


def test_cnn_and_resnet_convolutions_are_matrices_and_their_heads_are_not():
  for model in (purax.nn.CNN(num_classes=10), purax.nn.ResNet(num_classes=10)):
    params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8, 8, 1)))['params']
    rows = optimizers.muon_leaves(params)
    convs = [r for r in rows if len(r.shape) == 4]
    assert convs and all(r.part == 'muon' and r.reduction == (0, 1, 2) and r.output == (3,)
                         for r in convs)
    heads = [r.path for r in rows if r.why.startswith('the output head')]
    assert heads == [{'CNN': 'Dense_1/kernel', 'ResNet': 'Dense_0/kernel'}[
        type(model).__name__]]
  # The MLP's Dense_10 comes after Dense_9 (a number, not a string order).
  params = {f'Dense_{i}': {'kernel': jnp.zeros((4, 4))} for i in range(11)}
  assert [r.path for r in optimizers.muon_leaves(params) if r.part == 'adamw'] == [
      'Dense_10/kernel']


def test_overrides_decide_first_and_are_checked(unrolled_params):
  """muon_leaves= moves a leaf to AdamW (None) or names its axes; the step
  uses it; a pattern matching nothing, bad axes or a bad value are named."""
  over = {r'layers_\d/mlp/wo': None,
          r'embed/embedding': optax.contrib.MuonDimensionNumbers(0, 1)}
  rows = {r.path: r for r in optimizers.muon_leaves(unrolled_params, over)}
  assert rows['layers_1/mlp/wo'].part == 'adamw' and rows['embed/embedding'].part == 'muon'
  assert rows['layers_1/mlp/wi'].part == 'muon'       # the rule for the others
  tx = optimizers.muon(learning_rate=LR, total_steps=10, muon_leaves=over)
  state = tx.init(unrolled_params)
  grads = grads_of(lm(False), unrolled_params, lm_batch())
  updates, _ = jax.jit(tx.update)(grads, state, unrolled_params)
  s = np.linalg.svd(np.asarray(updates['embed']['embedding']), compute_uv=False) / LR
  assert 0.6 < s.max() < 1.3
  with pytest.raises(purax.ConfigError, match=r"^muon_leaves: expected patterns that each "
                     r"match a leaf path.*got \['nope'\] matching none"):
    optimizers.muon_leaves(unrolled_params, {'nope': None})
  with pytest.raises(purax.ConfigError, match=r"^muon_leaves\['embed/embedding'\]: expected "
                     r"axes of embed/embedding"):
    optimizers.muon_leaves(unrolled_params, {'embed/embedding':
                                             optax.contrib.MuonDimensionNumbers(0, 2)})
  with pytest.raises(purax.ConfigError, match=r"^muon_leaves\['x'\]: expected optax"):
    optimizers.muon(total_steps=10, muon_leaves={'x': (0, 1)})
  with pytest.raises(purax.ConfigError, match=r'^muon_leaves: expected None or a mapping'):
    optimizers.muon(total_steps=10, muon_leaves=[('x', None)])


def test_weight_decay_follows_the_mask_over_both_parts(unrolled_params):
  """Zero gradients: only the decay moves a leaf, by lr * wd * p in either part."""
  zero = jax.tree.map(jnp.zeros_like, unrolled_params)
  rows = optimizers.muon_leaves(unrolled_params)
  for mask, decayed in ((optim.matrices, lambda r: len(r.shape) >= 2),
                        (None, lambda r: True)):
    tx = optimizers.muon(learning_rate=LR, total_steps=10**6, weight_decay=0.5,
                         weight_decay_mask=mask)
    u, _ = jax.jit(tx.update)(zero, tx.init(unrolled_params), unrolled_params)
    for row, a, p in zip(rows, jax.tree.leaves(u), jax.tree.leaves(unrolled_params)):
      want = -LR * 0.5 * np.asarray(p) if decayed(row) else np.zeros(p.shape)
      np.testing.assert_allclose(a, want, rtol=1e-6, atol=1e-9, err_msg=row.path)


def test_the_table_formats_a_row_per_leaf(unrolled_params):
  rows = optimizers.muon_leaves(unrolled_params)
  text = optimizers.format_muon_leaves(rows)
  assert len(text.splitlines()) == len(rows) + 2
  assert re.search(r'\nlayers_0/attention/qkv +\[32, 3, 4, 8\] +muon +red \[0\] out \[2, 3\] '
                   r'batch \[1\] +attention q, k, v', text)
  assert text.splitlines()[-1].startswith('muon: 12 leaves, 36,864 parameters; adamw: ')


def test_inside_optax_partition_a_masked_leaf_changes_no_other_leaf_s_answer():
  """Within optax.partition the Muon part sees the AdamW leaves as MaskedNode:
  the rule still sees their paths (the head stays Dense_2, so Dense_1 keeps
  its axes), and masked leaves stay masked."""
  params = {f'Dense_{i}': {'kernel': jnp.zeros(s)} for i, s in enumerate([(4, 8), (8, 16),
                                                                          (16, 3)])}
  masked = {**params, 'Dense_2': {'kernel': optax.MaskedNode()}}
  full, part = muon_lib.dimension_numbers(params), muon_lib.dimension_numbers(masked)
  assert full['Dense_2']['kernel'] is None
  assert isinstance(part['Dense_2']['kernel'], optax.MaskedNode)
  for name in ('Dense_0', 'Dense_1'):
    assert part[name]['kernel'] == full[name]['kernel'] == ((0,), (1,))
  assert muon_lib.labels(masked)['Dense_1']['kernel'] == 'muon'
