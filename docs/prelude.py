# What the API reference's examples assume (tests/test_docs.py runs them after it).
import jax
import jax.numpy as jnp
import numpy as np
import optax

import purax
from purax import parallel

rng = np.random.default_rng(0)
x = rng.random((64, 8, 8, 1), dtype=np.float32)                 # 64 images [8, 8, 1]
batch = {'x': x, 'y': (x.sum((1, 2, 3)) > 32).astype(np.int32)}    # labels [64], int32
batches = [batch] * 20                                           # a data set: 20 steps
test = [batch]                                                   # evaluation batches
