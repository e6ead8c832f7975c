"""The jaxpr of ``Task.step`` for two tiny tasks (an MLP classifier and a
byte-level decoder LM), as text: what tests/core/test_spikes.py compares
with the programs recorded before the spike guard and z-loss existed
(``tests/fixtures/step_program_*.txt``), to show that with both options off
the step is the same program.

usage: python -m tests.scripts.step_program {mlp,lm}   (prints the jaxpr)

Regenerate a fixture only for a deliberate change of the step's program
(then say so in the commit): ``python -m tests.scripts.step_program mlp >
tests/fixtures/step_program_mlp.txt``.
"""

import sys

import jax
import numpy as np

import purax
from purax.nn import MLP, DecoderLM


def task_and_batch(kind: str):
  """A tiny task of ``kind`` (``'mlp'`` or ``'lm'``) and a batch for it."""
  rng = np.random.default_rng(0)
  tx = purax.adamw(learning_rate=1e-2, total_steps=10, warmup_steps=2)
  if kind == 'mlp':
    batch = {'x': rng.normal(size=(4, 6)).astype(np.float32),
             'y': rng.integers(0, 3, 4).astype(np.int32)}
    return purax.Task(model=MLP(num_classes=3, features=(8,)), tx=tx), batch
  tokens = rng.integers(0, 16, (2, 9)).astype(np.int32)
  model = DecoderLM(vocab_size=16, d_model=8, num_layers=1, num_heads=2, max_len=8)
  return (purax.Task(model=model, tx=tx, loss=purax.objectives.language_model),
          {'x': tokens[:, :-1], 'y': tokens[:, 1:]})


def program(kind: str) -> str:
  """The jaxpr text of ``task.step`` on the tiny task ``kind``."""
  task, batch = task_and_batch(kind)
  state = jax.eval_shape(lambda b: task.init(jax.random.key(0), b), batch)
  return str(jax.make_jaxpr(task.step)(state, batch))


if __name__ == '__main__':
  print(program(sys.argv[1]), end='')
