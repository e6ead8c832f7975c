"""A whole run from a config: validate, load, build, train, save, evaluate.

Everything that can be wrong with the input is checked before a directory is
created or anything is compiled, so a bad run leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil

import jax

from purax.config import TrainConfig, build_task, sample_batch
from purax.core.errors import ConfigError, expect
from purax.io import checkpoint, datasets, pipeline, writers
from purax.loop import evaluate, fit


def _prepare(config: TrainConfig):
  config = config.validate().resolved()
  ds = datasets.load(config.dataset, num_classes=config.num_classes)
  task = build_task(config, num_classes=ds.num_classes, input_shape=ds.input_shape)
  train_data = pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=config.batch_size,
                                      seed=config.seed, num_steps=config.steps)
  return config, ds, task, train_data


def train(config: TrainConfig) -> dict:
  """Runs ``config`` end to end; returns the final evaluation metrics.

  Writes ``WORKDIR/config.json``, ``metrics.jsonl``, TensorBoard events,
  ``checkpoints/`` (the final state) and ``final_metrics.json``.

  Raises:
    ConfigError, DataError: before anything is written; FileExistsError: the
    run directory already exists.
  """
  config, ds, task, train_data = _prepare(config)
  workdir = config.workdir
  expect(not os.path.exists(workdir), 'workdir', 'a directory that does not exist yet',
         repr(workdir), FileExistsError)
  state = jax.jit(task.init)(jax.random.key(config.seed),
                             sample_batch(ds.x_train, ds.y_train, config.batch_size))
  os.makedirs(workdir)
  try:
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      f.write(config.to_json())
    writer = writers.create_default_writer(workdir, console=True)
    eval_data = pipeline.eval_batches(ds.x_test, ds.y_test, batch_size=config.eval_batch_size)
    try:
      state, history = fit(task, state, train_data, eval_data=eval_data,
                           log_every=config.log_every, eval_every=config.eval_every,
                           writer=writer, progress=config.progress)
    finally:
      writer.close()
    mngr = checkpoint.manager(os.path.join(workdir, 'checkpoints'))
    checkpoint.save(mngr, config.steps, state)
    mngr.wait_until_finished()
    mngr.close()
  except BaseException:
    # A run that did not finish its first log leaves no half-written directory.
    if not os.path.exists(os.path.join(workdir, 'metrics.jsonl')) or \
        os.path.getsize(os.path.join(workdir, 'metrics.jsonl')) == 0:
      shutil.rmtree(workdir, ignore_errors=True)
    raise
  final = {k[len('eval/'):]: v for rec in history for k, v in rec.items()
           if k.startswith('eval/')}
  with open(os.path.join(workdir, 'final_metrics.json'), 'w') as f:
    json.dump({'step': config.steps, **final}, f, indent=2)
  return final


def evaluate_run(workdir: str, *, batch_size: int | None = None) -> dict:
  """Restores the newest checkpoint of a run and evaluates it on the test split.

  Raises:
    ConfigError: ``workdir`` is not a purax run directory.
    FileNotFoundError: it has no committed checkpoint.
  """
  path = os.path.join(workdir, 'config.json')
  expect(os.path.isfile(path), 'workdir', 'a run directory with config.json',
         repr(workdir), ConfigError)
  with open(path) as f:
    config = TrainConfig.from_json(f.read())
  config, ds, task, _ = _prepare(config)
  abstract = jax.eval_shape(task.init, jax.random.key(0),
                            sample_batch(ds.x_train, ds.y_train, config.batch_size))
  mngr = checkpoint.manager(os.path.join(workdir, 'checkpoints'))
  try:
    state = checkpoint.restore(mngr, abstract)
  finally:
    mngr.close()
  batches = pipeline.eval_batches(ds.x_test, ds.y_test,
                                  batch_size=batch_size or config.eval_batch_size)
  return evaluate(task, state, batches)
