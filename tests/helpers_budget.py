"""What the tests of a run on a time budget share (tests/hooks/test_time_budget.py,
tests/app/test_verdict.py): a tiny task and its batches."""

import numpy as np
import optax

import purax

TASK = purax.Task(model=purax.nn.MLP(features=(8,), num_classes=3),
                  tx=optax.sgd(0.1))
RNG = np.random.default_rng(0)
BATCHES = [{'x': RNG.normal(size=(4, 5)).astype(np.float32),
            'y': RNG.integers(0, 3, size=(4,)).astype(np.int32)} for _ in range(8)]
EVAL = BATCHES[:2]
