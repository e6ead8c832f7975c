"""``purax train --optimizer muon`` with the rule purax had before #46.2 (optax's default: every
2-D leaf on Muon, so on the unrolled LM the embedding and the MLP kernels; the
attention kernels, 3-D and 4-D, on AdamW), emulated by muon_leaves= overrides
of the unrolled DecoderLM's leaves: the control of ``benchmarks/README.md``,
"Muon against AdamW on the LM".

Usage: ``python benchmarks/muon_rule_before.py train --model lm ... --optimizer muon``
(the arguments of ``purax``).
"""
import functools
import sys

import optax

import purax.core.optimizers as o
from purax.app import cli

OLD = {r'embed/embedding': optax.contrib.MuonDimensionNumbers(0, 1),
       r'layers_\d+/attention/(qkv|out)': None}
o.muon = functools.partial(o.muon, muon_leaves=OLD)
sys.exit(cli.main(sys.argv[1:]))
