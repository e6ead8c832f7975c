"""Which leaves ``--optimizer muon`` orthogonalises: the table of
:func:`purax.core.muon.muon_leaves` for the DecoderLM (unrolled and scanned),
the CNN and the ResNet at their command-line sizes (LM: ``--model lm``'s
defaults, 4 layers, d_model 128; CNN and ResNet on 8x8 digits), as JSON
(biases and norm scales, all on AdamW, counted, not listed).
Shapes only (``jax.eval_shape``): nothing is trained; seconds on any machine.

Usage::

  python benchmarks/muon_leaves.py --out benchmarks/measured/cpu_s21/muon_leaves.json
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax                                        # noqa: E402
import jax.numpy as jnp                           # noqa: E402

import purax                                      # noqa: E402
from benchmarks.jsonout import write_json         # noqa: E402
from purax.core.muon import muon_leaves           # noqa: E402

MODELS = {
    'lm_unrolled': (purax.nn.DecoderLM(scan_layers=False), jnp.zeros((1, 16), jnp.int32)),
    'lm_scanned': (purax.nn.DecoderLM(scan_layers=True), jnp.zeros((1, 16), jnp.int32)),
    'cnn': (purax.nn.CNN(num_classes=10), jnp.zeros((1, 8, 8, 1))),
    'resnet': (purax.nn.ResNet(num_classes=10), jnp.zeros((1, 8, 8, 1))),
}


def table(model, x) -> dict:
  params = jax.eval_shape(model.init, jax.random.key(0), x)['params']
  rows = muon_leaves(params)
  count = lambda part: sum(int(jnp.prod(jnp.array(r.shape))) for r in rows  # noqa: E731
                           if r.part == part)
  vectors = [r for r in rows if r.why.startswith(('a vector', 'a bias'))]
  return {'muon_params': count('muon'), 'adamw_params': count('adamw'),
          'biases_and_norms_on_adamw': len(vectors),
          'leaves': [{'path': r.path, 'shape': list(r.shape), 'part': r.part,
                      **({'reduction': list(r.reduction), 'output': list(r.output),
                          'batch': list(r.batch)} if r.part == 'muon' else {}),
                      'why': r.why} for r in rows if r not in vectors]}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default='benchmarks/results/muon_leaves.json')
  args = parser.parse_args(argv)
  result = {'source': 'purax.core.muon.muon_leaves (the rule: its module docstring)',
            **{name: table(*spec) for name, spec in MODELS.items()}}
  write_json(args.out, result)
  return result


if __name__ == '__main__':
  main()
