"""Wrong kinds and values for the public Python entry points (issue 28.7):
every call either succeeds or raises a purax error (a ``PuraxError``
subclass, named), never another exception type (an AttributeError at init, a
TypeError deep in plan.py, flax's scope errors). The fuzz draws each argument
of each entry point from a small set of wrong values; the named cases of the
issue follow, each with its message."""

import itertools
import os
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import purax
from purax.app.config import TrainConfig
from purax.core.errors import ConfigError, DataError, PuraxError
from purax.io import datasets
from purax.io.checkpoint import CheckpointError
from tests.helpers import tiny_batch, tiny_task

WRONG = st.sampled_from([None, 1, 'x', 1.5, [], {}, object(), np.zeros(3), float('nan')])


@pytest.fixture(scope='module')
def world(tmp_path_factory):
  task = tiny_task()
  batch = tiny_batch()
  state = task.init(jax.random.key(0), batch)
  checkpointer = purax.Checkpointer(str(tmp_path_factory.mktemp('ckpt')), async_save=False)
  yield {'task': task, 'batch': batch, 'state': state, 'checkpointer': checkpointer,
         'steps': itertools.count(100), 'tmp': tmp_path_factory}
  checkpointer.close()


def fresh(w):
  return jax.tree.map(jnp.copy, w['state'])     # fit donates its state


def _task(w, **kw):
  return purax.Task(**{'model': w['task'].model, 'tx': w['task'].tx, **kw})


def _fit(w, **kw):
  args = {'task': w['task'], 'state': fresh(w), 'train_data': [w['batch']] * 2, **kw}
  kw = {'steps': 1, 'hooks': [], **{k: v for k, v in args.items()
                                    if k not in ('task', 'state', 'train_data')}}
  return purax.fit(args['task'], args['state'], args['train_data'], **kw)


def _restore(w, **kw):
  args = {'directory': str(w['tmp'].mktemp('run')), 'task': w['task'],
          'key': jax.random.key(0), 'batch': w['batch'], **kw}
  return purax.restore_or_init(**args)


def _save(w, **kw):
  args = {'step': next(w['steps']), 'tree': w['state'], **kw}
  return w['checkpointer'].save(args.pop('step'), args.pop('tree'), **args)


# (entry point, argument) -> call with that argument set to the drawn value.
CALLS = {
    **{('Task', a): (lambda a: lambda w, v: _task(w, **{a: v}))(a)
       for a in ('model', 'tx', 'loss', 'hparams', 'microbatches', 'skip_nonfinite',
                 'loss_scale')},
    ('Task.init', 'key'): lambda w, v: w['task'].init(v, w['batch']),
    ('Task.init', 'batch'): lambda w, v: w['task'].init(jax.random.key(0), v),
    ('Task.step', 'state'): lambda w, v: w['task'].step(v, w['batch']),
    ('Task.step', 'batch'): lambda w, v: w['task'].step(w['state'], v),
    ('Task.step', 'axis_name'): lambda w, v: w['task'].step(w['state'], w['batch'], axis_name=v),
    ('Task.step', 'frozen'): lambda w, v: w['task'].step(w['state'], w['batch'], frozen=v),
    ('Task.evaluate', 'state'): lambda w, v: w['task'].evaluate(v, w['batch']),
    ('Task.evaluate', 'batch'): lambda w, v: w['task'].evaluate(w['state'], v),
    ('Task.gradients', 'state'): lambda w, v: w['task'].gradients(v, w['batch']),
    ('Task.gradients', 'batch'): lambda w, v: w['task'].gradients(w['state'], v),
    ('Task.gradients', 'axis_name'): lambda w, v: w['task'].gradients(w['state'], w['batch'],
                                                                      axis_name=v),
    **{('fit', a): (lambda a: lambda w, v: _fit(w, **{a: v}))(a)
       for a in ('task', 'state', 'train_data', 'steps', 'plan', 'hooks', 'steps_per_call',
                 'iterator_resume')},
    **{('fit hooks.standard', a): (lambda a: lambda w, v: _fit(
        w, hooks=purax.hooks.standard(**{a: v, 'progress': a == 'progress' and v})))(a)
       for a in ('log_every', 'writer', 'eval_data', 'eval_every', 'checkpointer',
                 'checkpoint_every', 'should_stop', 'stop_every', 'max_consecutive_skips',
                 'progress', 'profile', 'profile_memory')},
    **{('adamw', a): (lambda a: lambda w, v: purax.adamw(**{'total_steps': 10, a: v}))(a)
       for a in ('learning_rate', 'total_steps', 'warmup_steps', 'weight_decay', 'b1', 'b2',
                 'eps', 'clip_norm', 'eps_root')},
    ('hyperparams', 'state'): lambda w, v: purax.hyperparams(v),
    ('hyperparams', 'tx'): lambda w, v: purax.hyperparams(w['state'], v),
    ('set_hyperparams', 'state'): lambda w, v: purax.set_hyperparams(v, b1=0.5),
    ('set_hyperparams', 'values'): lambda w, v: purax.set_hyperparams(w['state'], v),
    ('set_hyperparams', 'b1'): lambda w, v: purax.set_hyperparams(w['state'], b1=v),
    **{('restore_or_init', a): (lambda a: lambda w, v: _restore(w, **{a: v}))(a)
       for a in ('directory', 'task', 'key', 'batch', 'plan', 'hooks', 'move_aside',
                 'must_exist')},
    **{('Checkpointer.save', a): (lambda a: lambda w, v: _save(w, **{a: v}))(a)
       for a in ('step', 'tree', 'metrics', 'extra')},
    **{('Checkpointer', a): (lambda a: lambda w, v: purax.Checkpointer(
        (str(w['tmp'].mktemp('d') / v) if isinstance(v, str) else v) if a == 'directory'
        else str(w['tmp'].mktemp('ckpt')),   # a path string: under tmp, never the cwd
        **({} if a == 'directory' else {a: v})).close())(a)
       for a in ('directory', 'keep_last', 'keep_best', 'best_metric', 'best_mode', 'metadata',
                 'async_save', 'interval_s', 'verify')},
}


@pytest.mark.parametrize('entry,argument', sorted(CALLS), ids=lambda x: x)
@given(value=WRONG)
def test_a_wrong_argument_is_a_purax_error_or_a_correct_result(world, entry, argument, value):
  try:
    CALLS[entry, argument](world, value)
  except PuraxError as e:
    assert ': expected ' in str(e), (entry, argument, value, e)


# -- the cases the issue names, each with its message ---------------------------


def test_task_with_tx_none_is_a_config_error_at_construction():
  with pytest.raises(ConfigError, match='tx: expected an optax transformation'):
    purax.Task(model=tiny_task().model, tx=None)


def test_step_of_none_names_the_state(world):
  with pytest.raises(ConfigError, match='state: expected a purax.TrainState'):
    world['task'].step(None, world['batch'])


def test_eval_data_of_one_batch_dict_is_refused_by_the_hooks(world):
  with pytest.raises(ConfigError, match='eval_data: expected evaluation batches'):
    purax.hooks.standard(eval_data=world['batch'])


def test_a_writer_without_write_scalars_is_refused_before_the_loop(world):
  with pytest.raises(ConfigError, match='writer: expected a MetricWriter'):
    purax.hooks.standard(writer=object())


def test_checkpointer_save_of_a_non_array_names_the_leaf(world):
  before = world['checkpointer'].steps()
  with pytest.raises(CheckpointError, match=r"tree\['w'\]: expected an array, got str"):
    world['checkpointer'].save(next(world['steps']), {'w': 'text'})
  with pytest.raises(CheckpointError, match='step: expected an integer'):
    world['checkpointer'].save(1.5, world['state'])
  assert world['checkpointer'].steps() == before     # nothing written


def test_a_state_of_another_model_is_a_config_error_naming_the_first_path(world):
  other = purax.Task(model=purax.nn.MLP(num_classes=10, features=(32,)), tx=world['task'].tx)
  state = other.init(jax.random.key(0), world['batch'])
  with pytest.raises(ConfigError, match=r"fit: state.params: \['Dense_0'\]"
                                        r"\['bias'\]: expected float32\[16\].*got float32\[32\]"
                                        r" in the state"):
    purax.fit(world['task'], state, [world['batch']] * 2, steps=1, hooks=[])
  deeper = purax.Task(model=purax.nn.MLP(num_classes=10, features=(16, 16)),
                      tx=world['task'].tx).init(jax.random.key(0), world['batch'])
  with pytest.raises(ConfigError, match=r"\['Dense_2'\].*expected no such entry"):
    purax.fit(world['task'], deeper, [world['batch']] * 2, steps=1, hooks=[])


def _forge(path, key, shape):
  """An .npz whose member ``key`` has a header claiming ``shape`` (float64)."""
  body = np.zeros(4)
  with zipfile.ZipFile(path, 'w') as z:
    for name in datasets.NPZ_KEYS:
      with z.open(f'{name}.npy', 'w') as f:
        if name == key:
          np.lib.format.write_array_header_1_0(
              f, {'descr': '<f8', 'fortran_order': False, 'shape': shape})
          f.write(body.tobytes())
        else:
          np.lib.format.write_array(f, np.zeros((4, 2)) if 'x' in name else np.zeros(4, int))


def test_an_npz_header_claiming_more_than_the_file_is_a_data_error(tmp_path):
  path = str(tmp_path / 'forged.npz')
  _forge(path, 'x_train', (1 << 20, 1 << 20, 3))        # 24 TiB claimed, 32 bytes held
  with pytest.raises(DataError, match=r"key 'x_train': expected 26388279066624 bytes of data "
                                      r"for its header \(float64\[1048576, 1048576, 3\]\), "
                                      r"got 32"):
    datasets.from_npz(path)
  single = str(tmp_path / 'forged.npy')          # a lone .npy: mapped, never allocated
  with open(single, 'wb') as f:
    np.lib.format.write_array_header_1_0(
        f, {'descr': '<f8', 'fortran_order': False, 'shape': (1 << 20, 1 << 20, 3)})
    f.write(np.zeros(4).tobytes())
  with pytest.raises(DataError, match='dataset: expected an .npz archive'):
    datasets.from_npz(single)


def test_a_config_json_of_non_utf8_bytes_is_a_config_error_naming_the_file(tmp_path):
  with pytest.raises(ConfigError, match='run/config.json: expected UTF-8 JSON text'):
    TrainConfig.from_json(b'\xff\xfe{"format": 2}', 'run/config.json')
  os.makedirs(tmp_path / 'run')
  (tmp_path / 'run' / 'config.json').write_bytes(b'\xff\xfe')
  (tmp_path / 'run' / 'metrics.jsonl').write_text('{"step": 1, "train/loss": 1.0}\n')
  pytest.importorskip('matplotlib')
  from purax.app import plot
  plot.plot_run(str(tmp_path / 'run'), str(tmp_path / 'curves.png'))   # curves, no schedule
  from purax.app import rundir
  with pytest.raises(ConfigError, match='config.json: expected UTF-8 JSON text'):
    rundir.read_config(str(tmp_path / 'run'))        # what train/eval/export read


@pytest.mark.parametrize('name', ['team/project', 'a\\b', 'p#1', 'what?', '50%', 'a:b', ''])
def test_a_wandb_project_name_wandb_refuses_is_a_config_error_before_any_work(name):
  config = TrainConfig.of(model='mlp', wandb_project=name)
  with pytest.raises(ConfigError, match='wandb_project: expected a W&B project name'):
    config.validate()
