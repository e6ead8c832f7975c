"""Every model kind purax accepts round-trips through a checkpoint: a state of
a linen, an NNX, a plain-functions and an Equinox model (each with
non-trainable state: batch statistics, eqx.nn.State, a counter) is saved,
restored in a fresh process and resumed, bitwise equal to the run that never
stopped; and the checkpoint layout (purax/io/checkpoint/layout.py) calls no
framework's private methods on the model's nodes."""

import ast
import pathlib

import numpy as np
import pytest

from tests.helpers_runs import script

KINDS = ('linen', 'nnx', 'functions', 'equinox')
LAYOUT = pathlib.Path(__file__).resolve().parents[2] / 'purax' / 'io' / 'checkpoint' / 'layout.py'


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
