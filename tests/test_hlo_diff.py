"""benchmarks/hlo_diff.py: the StableHLO it reads is counted right (ops by
kind, ops inside conditional branches, jax's constant platform switches
apart, custom calls, donated bytes, the area of each op by its source)."""

import os
import sys

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'benchmarks'))
import hlo_diff  # noqa: E402

from purax.core import optim  # noqa: E402


def step(state, x):
  def loss(w):
    return jnp.sum(jnp.tanh(x @ w) ** 2)
  g = jax.grad(loss)(state['w'])
  norm = optim.global_norm(g)                      # the optimizer's area
  w = jax.lax.cond(norm > 1.0, lambda: state['w'] - g / norm, lambda: state['w'] * 2.0)
  return {'w': w}, norm


def test_summarize_counts_kinds_branches_bytes_and_areas():
  args = ({'w': jax.ShapeDtypeStruct((8, 4), jnp.float32)},
          jax.ShapeDtypeStruct((16, 8), jnp.float32))
  cpu = hlo_diff.summarize(hlo_diff.lowered_text(step, args, 'cpu'))
  cuda = hlo_diff.summarize(hlo_diff.lowered_text(step, args, 'cuda'))
  # forward x @ w, and the gradient's dot
  assert cpu['ops']['dot_general'][0] == 2
  assert cpu['ops']['dot_general'][1] == (16 * 4 + 8 * 4) * 4
  # The cond is real on both (one multiply by 2 in a branch); global_norm's
  # platform switch is jax's static case, and its overflow branch is a
  # conditional on the CPU only (purax.core.loops.SELECT_PLATFORMS).
  assert cpu['ops']['case'][0] == 2 and cuda['ops']['case'][0] == 1
  assert cpu['ops']['case_static'][0] >= 1 and cuda['ops']['case_static'][0] >= 1
  assert cuda['in_branches'][0] >= 2 and cpu['in_branches'][0] > cuda['in_branches'][0]
  assert cpu['argument_bytes'] == (8 * 4 + 16 * 8) * 4 and cpu['donated_bytes'] == 8 * 4 * 4
  assert cpu['output_bytes'] == 8 * 4 * 4 + 4
  assert cpu['areas']['optimizer'][0] > 0 and cuda['areas']['optimizer'][0] > 0
  assert 'loss' in cpu['areas'] and 'loss:bwd' in cpu['areas']   # `loss` by its name
  assert cpu['custom_calls'] == {}
  table = hlo_diff.table('cpu', 'cuda', cpu, cuda)
  assert 'ops inside conditional branches' in table and 'area/kind' in table
  # The difference itemised by area, and what is left beyond the guard's selects.
  d = hlo_diff.diff(cpu, cuda)
  assert d['difference_by_area'] and all(
      v == [cpu['areas'].get(k, [0, 0])[i] - cuda['areas'].get(k, [0, 0])[i] for i in (0, 1)]
      for k, v in d['difference_by_area'].items())
  assert sum(v[1] for v in d['difference_by_area'].values()) == \
      cpu['total_result_bytes'] - cuda['total_result_bytes']
  assert d['guard_select_bytes'] == 0 and d['excess_over_guard_pct'] == pytest.approx(
      100 * (cpu['total_result_bytes'] - cuda['total_result_bytes']) / cuda['total_result_bytes'])
  assert 'the difference by area: ' in table and "beyond the guard's selects" in table


def test_the_lm_loss_at_zero_smoothing_adds_no_logits_sized_value_to_plain_cross_entropy():
  # lm.py's tiny config (logits [4, 64, 512]) lowered for CUDA: purax's default
  # step, and the same step with optax's cross-entropy as its loss.
  with hlo_diff.pretend_cuda():
    ours, plain = (hlo_diff.summarize(hlo_diff.lowered_text(*hlo_diff.builtin('tiny', name)))
                   for name in ('purax', 'purax_plain_loss'))
  logits = 4 * 64 * 512 * 4                                  # one float32 copy
  producing = lambda s: {v[1]: v[2] for v in s['largest_values']}.get('4x64x512xf32')  # noqa: E731
  assert producing(ours) == producing(plain) == 9, (producing(ours), producing(plain))
  # The label-smoothing term (s = 0, traced) adds only per-token values.
  for area in ('loss', 'loss:bwd'):
    assert abs(ours['areas'][area][1] - plain['areas'][area][1]) < logits / 8, area
