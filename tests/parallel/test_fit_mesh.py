"""`fit(plan=...)` and `purax train --mesh`: the loop runs the sharded step."""

import json

import jax
import numpy as np
import pytest

import purax
from purax import ConfigError, parallel, testing
from purax.app.cli import main
from tests.helpers import refilling


def mlp_on_mesh(steps):
  """A small MLP task, ``steps`` batches of 16 and its plan on a data=4 x fsdp=2 mesh."""
  task = purax.Task(model=purax.nn.MLP(num_classes=4, features=(16,)),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=steps))
  rng = np.random.default_rng(0)
  data = [{'x': rng.normal(size=(16, 8)).astype(np.float32),
           'y': rng.integers(0, 4, 16).astype(np.int32)} for _ in range(steps)]
  mesh = parallel.make_mesh(data=4, fsdp=2)
  return task, data, parallel.sharded(task, mesh, parallel.for_mesh(mesh, fsdp_min_size=64),
                                      data[0])


def test_fit_with_plan_equals_fit_on_one_device():
  task, data, plan = mlp_on_mesh(4)
  with jax.default_matmul_precision('highest'):
    one, hist_one = purax.fit(task, jax.jit(task.init)(jax.random.key(0), data[0]), data, hooks=purax.hooks.standard(log_every=2, progress=False))
    many, hist_many = purax.fit(task, plan.init(jax.random.key(0)), data, plan=plan, hooks=purax.hooks.standard(log_every=2, progress=False))
  assert many.params['Dense_0']['kernel'].sharding.spec == \
      plan.state_sharding.params['Dense_0']['kernel'].spec
  testing.assert_trees_close(many.params, one.params,
                             testing.TOLERANCES["params"])
  assert [h['train/loss'] for h in hist_many] == pytest.approx(
      [h['train/loss'] for h in hist_one], rel=1e-5)


def test_for_mesh_picks_the_strategy():
  assert parallel.for_mesh(parallel.make_mesh()) == parallel.data_parallel()
  assert parallel.for_mesh(parallel.make_mesh(fsdp=-1)).fsdp_axis == 'fsdp'
  assert parallel.for_mesh(parallel.make_mesh(tensor=2)).uses_logical


def test_cli_train_on_a_mesh(tmp_path, capsys):
  workdir = tmp_path / 'run'
  code = main(['train', '--model', 'mlp', '--steps', '4', '--batch-size', '16',
               '--mesh', 'data=4,fsdp=2', '--eval-every', '0', '--log-every', '2',
               '--eval-batch-size', '64', '--no-progress', '--workdir', str(workdir)])
  assert code == 0, capsys.readouterr().err
  out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert np.isfinite(out['final']['loss'])


def test_cli_rejects_bad_mesh(tmp_path, capsys):
  code = main(['train', '--mesh', 'data=3', '--workdir', str(tmp_path / 'r'),
               '--no-progress', '--steps', '1'])
  assert code == 2
  assert 'mesh: expected axis sizes multiplying to the 8 devices' in capsys.readouterr().err


def test_config_rejects_malformed_mesh():
  with pytest.raises(ConfigError, match="mesh axis: expected one of"):
    purax.app.config.TrainConfig.of(mesh='model=2').validate()


def test_a_sharded_fit_trains_on_the_batches_a_refilling_loader_yielded():
  """prefetch_to_device copies each batch on the CPU: device_put may use an
  aligned numpy array's memory in place, which a loader refills next."""
  task, fresh, plan = mlp_on_mesh(6)
  runs = [purax.fit(task, plan.init(jax.random.key(0)), data, steps=6, plan=plan, hooks=purax.hooks.standard(log_every=3, progress=False))[0].params for data in (fresh, refilling(fresh))]
  for a, b in zip(*map(jax.tree.leaves, runs)):
    np.testing.assert_array_equal(a, b)
