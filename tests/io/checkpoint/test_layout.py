"""The checkpoint layout (purax/io/checkpoint/layout.py).

Every model kind purax accepts round-trips through a checkpoint: a state of
a linen, an NNX, a plain-functions and an Equinox model (each with
non-trainable state: batch statistics, eqx.nn.State, a counter) is saved,
restored in a fresh process and resumed, bitwise equal to the run that never
stopped; and the checkpoint layout (purax/io/checkpoint/layout.py) calls no
framework's private methods on the model's nodes.

A checkpoint in the layout before 0.3 (guard state in the fields
``loss_scale`` and ``spike_window`` of the state, ``layout.TrainStateBefore030``)
restores into ``TrainState.guards`` and resumes bitwise, on a state or a
population. The layout itself is held against a run written by 0.2's code in
tests/app/test_old_runs.py (its checkpoint's recorded signature is checked on
restore).
"""

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purax
from purax.core import population as P
from purax.io.checkpoint import Checkpointer, layout
from purax.io.checkpoint.errors import CheckpointMismatchError
from tests.helpers_runs import script

KINDS = ('linen', 'nnx', 'functions', 'equinox')
LAYOUT = pathlib.Path(__file__).resolve().parents[3] / 'purax' / 'io' / 'checkpoint' / 'layout.py'


@pytest.mark.parametrize('kind', KINDS)
def test_a_state_of_each_model_kind_resumes_bitwise_in_a_fresh_process(kind, tmp_path):
  if kind == 'equinox':
    pytest.importorskip('equinox')
  straight, first, resumed = (str(tmp_path / f'{n}.npz') for n in ('straight', 'first', 'resumed'))
  assert script('model_roundtrip.py', kind, tmp_path / 'a', 0, straight) == 'final step 6'
  assert script('model_roundtrip.py', kind, tmp_path / 'b', 3, first) == 'final step 3'
  assert script('model_roundtrip.py', kind, tmp_path / 'b', 0, resumed) == 'final step 6'
  a, b, f = np.load(straight), np.load(resumed), np.load(first)
  assert sorted(a) == sorted(b) and len(a) > 5, sorted(a)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=f'{kind}: {name}')
  model_state = [n for n in a if n.startswith('.model_state')]
  assert model_state, sorted(a)                  # the non-trainable state is in the tree
  assert any(not np.array_equal(f[n], a[n]) for n in model_state), 'it changed after the stop'


def test_the_layout_calls_no_private_method_of_a_framework():
  """Only JAX's key dtype's ``_impl`` (no public spelling for an abstract
  key's implementation); nothing private of flax, NNX or Equinox nodes."""
  private = sorted({node.attr for node in ast.walk(ast.parse(LAYOUT.read_text()))
                    if isinstance(node, ast.Attribute) and node.attr.startswith('_')
                    and not node.attr.startswith('__')})
  assert private == ['_impl'], private


TASK = purax.Task(model=purax.nn.MLP(num_classes=3, features=(8,)),
                  tx=purax.adamw(learning_rate=1e-2, total_steps=8),
                  loss_scale=2.0 ** 15, spike_guard=purax.SpikeGuard(window=4, k=3.0))


def batch(i):
  rng = np.random.default_rng(i)
  return {'x': (rng.normal(size=(8, 6)) * (30.0 if i == 5 else 1.0)).astype(np.float32),
          'y': rng.integers(0, 3, 8).astype(np.int32)}


def leaves_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = (jax.random.key_data(v) if jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key)
            else v for v in (x, y))
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize('members', [None, 2])
def test_a_checkpoint_of_the_old_layout_restores_into_guards_and_resumes_bitwise(tmp_path,
                                                                                   members):
  if members is None:
    state = TASK.init(jax.random.key(0), batch(0))
    step = jax.jit(lambda s, b: TASK.step(s, b))
  else:
    state = P.init(TASK, jax.vmap(jax.random.key)(jnp.arange(members)),
                   {'weight_decay': jnp.asarray([1e-4, 1e-1])}, batch(0))
    step = jax.jit(lambda s, b: P.step(TASK, s, b)[:2])
  abstract = jax.eval_shape(lambda: {'state': state})
  for i in range(4):
    state, _ = step(state, batch(i))
  # As 0.2 wrote it: a stored tree without 'guards' (orbax's metadata: nested mappings).
  saved = {'state': {} if members is None else {'state': {}}}
  old = layout.in_saved_layout({'state': state}, saved)
  inner = old['state'] if members is None else old['state'].state
  assert isinstance(inner, layout.TrainStateBefore030)
  assert inner.loss_scale is not None and inner.spike_window is not None
  with Checkpointer(str(tmp_path / 'ckpt'), async_save=False) as ckpt:
    ckpt.save(4, old)
    saved_paths = [p for p, _, _ in layout.signature(old)]
    assert any(p.endswith('.loss_scale.scale') for p in saved_paths)
    assert not any('guards' in p for p in saved_paths)
    restored, _, at = ckpt.restore(abstract)
  assert at == 4
  leaves_equal(restored, {'state': state})
  resumed, straight = restored['state'], state
  for i in range(4, 8):
    resumed, _ = step(resumed, batch(i))
    straight, _ = step(straight, batch(i))
  leaves_equal(resumed, straight)


def test_guard_state_an_old_checkpoint_cannot_hold_is_named():
  state = TASK.init(jax.random.key(0), batch(0))
  state = state.replace(guards={**state.guards, 'mine': jnp.zeros(())})
  with pytest.raises(CheckpointMismatchError, match=r"state.guards: expected only .* got also "
                     r"\['mine'\]"):
    layout.in_saved_layout({'state': state}, {'state': {}})


def test_a_checkpoint_of_today_keeps_the_guards_subtree(tmp_path):
  state = TASK.init(jax.random.key(0), batch(0))
  assert layout.in_saved_layout({'state': state}, {'state': {'guards': {}}})['state'] is not None
  with Checkpointer(str(tmp_path / 'ckpt'), async_save=False) as ckpt:
    ckpt.save(0, {'state': state})
    restored, _, _ = ckpt.restore(jax.eval_shape(lambda: {'state': state}))
  assert sorted(restored['state'].guards) == ['loss_scale', 'spikes']
  leaves_equal(restored, {'state': state})
