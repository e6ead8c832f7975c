"""The Population plan on a mesh: the batch axis or the member axis split over
devices gives what one device gives (XLA partitions the same program)."""

import jax
import purax
import numpy as np
import pytest

from purax import loop
from purax import plan as plan_lib
from purax.core import population as P

from tests import helpers_population as tp


def _train(plan):
  pop = tp.pinit(tp.TASK, tp.keys([0, 1, 2, 3]),
                 {'learning_rate': np.float32([1e-3, 3e-3, 1e-2, 3e-2])}, tp.batch())
  pop, history = loop.fit(tp.TASK, pop, [tp.batch(s) for s in range(4)], plan=plan,
                          hooks=purax.hooks.standard(eval_data=[tp.batch(9)], log_every=2,
                                                     progress=False, max_consecutive_skips=None))
  return pop, history


@pytest.mark.parametrize('shard', ['batch', 'members'])
def test_population_on_a_mesh_equals_one_device(shard):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ('data',))
  with jax.default_matmul_precision('highest'):
    single, h1 = _train(plan_lib.PopulationPlan(tp.TASK))
    meshed, h2 = _train(plan_lib.PopulationPlan(tp.TASK, mesh=mesh, shard=shard))
  leaf = jax.tree.leaves(meshed.state.params)[0]
  if shard == 'members':
    assert leaf.sharding.spec[0] == ('data',) or leaf.sharding.spec[0] == 'data'
  for i in range(4):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=tp.RTOL, atol=tp.ATOL),
                 P.member(single, i).params, P.member(meshed, i).params)
  np.testing.assert_allclose(h1[-1]['eval/loss'], h2[-1]['eval/loss'], rtol=tp.RTOL)


def test_member_axis_must_divide_the_mesh():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ('data',))
  pop = tp.pinit(tp.TASK, tp.keys([0, 1, 2]), {}, tp.batch())
  with pytest.raises(Exception, match=r'members: expected a multiple of the mesh size 2'):
    plan_lib.PopulationPlan(tp.TASK, mesh=mesh, shard='members').place(pop)
