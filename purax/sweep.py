"""Hyperparameter sweeps as one population: search spaces, host loop, reports.

``purax sweep`` trains every member of a grid or random search at once (see
:mod:`purax.core.population`): one compiled step for the whole population,
whatever the values. Each member ``i`` reads the batches of its own seed
(members that share a seed share batches), so member ``i`` computes what
``purax train`` computes with member ``i``'s hyperparameters and seed. At the
end it prints and writes a table sorted by the eval metric (``sweep.json``),
plots per-member learning curves (``curves.png``) and saves the best member as
an ordinary run in ``WORKDIR/best`` that ``purax eval --workdir`` accepts.

Search spaces (grids, log-uniform draws, ``--lr`` specs) live in
:mod:`purax.search` and are re-exported here.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from typing import Literal, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from purax import hooks as hooks_lib
from purax import plan as plan_lib
from purax.core import population as pop_lib
from purax.core.errors import ConfigError, expect
from purax.loop import fit
from purax.search import FLAGS as FLAGS
from purax.search import Uniform as Uniform
from purax.search import grid as grid
from purax.search import log_uniform as log_uniform
from purax.search import members_from_specs as members_from_specs
from purax.search import parse_seeds as parse_seeds
from purax.search import parse_spec as parse_spec

# -- the host loop ----------------------------------------------------------


@jax.jit
def _keys(seeds):
  return jax.vmap(jax.random.key)(seeds)


def run_population(task, pop: pop_lib.Population, train_data, *, batch_index=None,
                   eval_data=None, eval_every: int = 0, log_every: int = 50,
                   metric: str = 'loss', mode: Literal['min', 'max'] = 'min',
                   patience: int = 0, pbt_every: int = 0, pbt_fraction: float = 0.25,
                   pbt_key: jax.Array | None = None, progress: bool = True):
  """Trains a population from its step to ``len(train_data)``: :func:`purax.fit`
  with the :class:`purax.plan.Population` plan and the population hooks.

  Args:
    task: the :class:`Task` every member runs.
    pop: the :class:`Population`; consumed (donated).
    train_data: ``train_data[s]`` is step ``s``'s batch, shared, or stacked
      ``[n, batch, ...]`` with ``batch_index`` (see :func:`population.step`).
    batch_index: int32 ``[members]`` or None.
    eval_data: evaluation batches shared by all members, iterated afresh.
    eval_every: evaluate every N steps and at the end (0: at the end only).
    log_every: fetch training metrics every N steps (the only host sync).
    metric, mode: the eval metric ranking members (early stopping, PBT).
    patience: early-stop a member after this many evaluations without
      improvement (0: off; :class:`purax.hooks.PopulationEarlyStopping`).
    pbt_every: every N steps (a multiple of ``eval_every``), after that
      step's evaluation, run :func:`pbt.exploit_explore` (0: off;
      :class:`purax.hooks.PBT`).
    pbt_fraction: PBT's truncation fraction.
    pbt_key: typed key of PBT, folded with the step.
    progress: show a progress bar for the population.

  Returns:
    ``(pop, history)``: records ``{'step', 'train/NAME' | 'eval/NAME': [members]}``
    of numpy arrays, plus ``'pbt/source'`` records when PBT ran.

  Raises:
    ConfigError: an interval out of range, PBT or early stopping without
      ``eval_data``, or ``pbt_every`` not a multiple of ``eval_every``.
  """
  expect(log_every >= 1, 'log_every', '>= 1', log_every, ConfigError)
  for name, value in (('eval_every', eval_every), ('patience', patience),
                      ('pbt_every', pbt_every)):
    expect(value >= 0, name, '>= 0', value, ConfigError)
    expect(value == 0 or name == 'eval_every' or eval_data is not None, name,
           '0 when there is no eval data', value, ConfigError)
  hooks = []
  if patience:
    hooks.append(hooks_lib.PopulationEarlyStopping(metric=metric, mode=mode,
                                                   patience=patience))
  if pbt_every:
    pbt_hook = hooks_lib.PBT(every=pbt_every, metric=metric, mode=mode,
                             fraction=pbt_fraction, key=pbt_key)
    pbt_hook.check(eval_every)
    hooks.append(pbt_hook)
  return fit(task, pop, train_data, plan=plan_lib.Population(task, batch_index),
             eval_data=eval_data, eval_every=eval_every, log_every=log_every,
             progress=progress, hooks=hooks, max_consecutive_skips=None)


# -- the command -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SweepConfig:
  """A sweep: many training runs of one model, trained at once as a population.

  Attributes:
    lr: peak learning rates: 'a,b,c', 'loguniform:LOW:HIGH' or 'uniform:LOW:HIGH'.
    weight_decay: decoupled weight decay spec (same forms).
    b1: Adam's first-moment decay spec.
    b2: Adam's second-moment decay spec.
    clip_norm: global-norm clipping threshold spec.
    label_smoothing: label smoothing spec, values in [0, 1).
    seeds: comma-separated seeds; crossed with every list spec.
    members: population size when a spec is random; when unset the grid size.
    sample_seed: seed of the random draws.
    model: model name (cnn, mlp, resnet).
    dataset: 'digits', 'mnist1d', or 'npz:PATH'.
    steps: optimizer updates per member.
    batch_size: examples per update.
    warmup_steps: linear warmup length.
    dropout_rate: dropout rate of the model (mlp, cnn), the same for all members.
    metric: eval metric that ranks members (loss is minimised, accuracy maximised).
    patience: early-stop a member after N evaluations without improvement (0: off).
    pbt_every: population-based training every N steps, at evaluations (0: off).
    pbt_fraction: share of members replaced by PBT, in (0, 0.5].
    workdir: sweep directory, runs/sweep-DATASET-MODEL-TIME when unset; must not exist.
    log_every: fetch training metrics every N steps.
    eval_every: evaluate every N steps (0: at the end only).
    eval_batch_size: examples per evaluation batch (the last is padded).
    num_classes: override the number of classes (npz data).
    progress: show a progress bar.
  """

  lr: str = '2e-3'
  weight_decay: str = '1e-4'
  b1: str = '0.9'
  b2: str = '0.999'
  clip_norm: str = '1.0'
  label_smoothing: str = '0.0'
  seeds: str = '0'
  members: int | None = None
  sample_seed: int = 0
  model: Literal['cnn', 'mlp', 'resnet'] = 'mlp'
  dataset: str = 'digits'
  steps: int = 300
  batch_size: int = 64
  warmup_steps: int = 20
  dropout_rate: float = 0.0
  metric: Literal['loss', 'accuracy'] = 'loss'
  patience: int = 0
  pbt_every: int = 0
  pbt_fraction: float = 0.25
  workdir: str | None = None
  log_every: int = 25
  eval_every: int = 100
  eval_batch_size: int = 512
  num_classes: int | None = None
  progress: bool = True

  def validate(self):
    """Checks every field and spec; returns ``(config, seeds, hparams)``.

    Raises:
      ConfigError: naming the field, the expected and the actual value.
    """
    for name in ('steps', 'batch_size', 'log_every', 'eval_batch_size'):
      expect(getattr(self, name) >= 1, name, '>= 1', getattr(self, name), ConfigError)
    for name in ('warmup_steps', 'patience', 'pbt_every', 'eval_every', 'sample_seed'):
      expect(getattr(self, name) >= 0, name, '>= 0', getattr(self, name), ConfigError)
    expect(0 < self.pbt_fraction <= 0.5, 'pbt_fraction', 'in (0, 0.5]', self.pbt_fraction,
           ConfigError)
    expect(not self.pbt_every or (self.eval_every and self.pbt_every % self.eval_every == 0),
           'pbt_every', f'0 or a multiple of eval_every={self.eval_every} (PBT ranks members '
           'by the evaluation at its step)', self.pbt_every, ConfigError)
    specs = {flag: parse_spec(flag, getattr(self, flag)) for flag in FLAGS}
    seeds, hparams = members_from_specs(specs, parse_seeds(self.seeds), self.members,
                                        key=jax.random.key(self.sample_seed))
    hparams = {FLAGS[flag][0]: v for flag, v in hparams.items()}
    config = self if self.workdir else dataclasses.replace(self, workdir=os.path.join(
        'runs', f"sweep-{self.dataset.replace(':', '_').replace('/', '_')}-{self.model}-"
        f"{time.strftime('%Y%m%d-%H%M%S')}"))
    return config, seeds, hparams

  def member_config(self, seed: int, hparams: Mapping[str, float], workdir: str):
    """The ordinary :class:`TrainConfig` of one member (b1/b2 live in its checkpoint)."""
    from purax.config import TrainConfig
    fields = {FLAGS[f][1]: float(hparams[FLAGS[f][0]]) for f in FLAGS if FLAGS[f][1]}
    return TrainConfig(model=self.model, dataset=self.dataset, steps=self.steps,
                       batch_size=self.batch_size, warmup_steps=self.warmup_steps,
                       dropout_rate=self.dropout_rate, seed=int(seed), workdir=workdir,
                       log_every=self.log_every, eval_every=self.eval_every,
                       eval_batch_size=self.eval_batch_size, num_classes=self.num_classes,
                       progress=False, **fields).with_model_sizes()


class _SeedBatches:
  """``ds[s]``: step ``s``'s batches of each distinct seed, stacked ``[seeds, batch, ...]``."""

  def __init__(self, datasets):
    self._datasets = datasets

  def __len__(self):
    return len(self._datasets[0])

  def __getitem__(self, s):
    if len(self._datasets) == 1:
      return self._datasets[0][s]
    batches = [d[s] for d in self._datasets]
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def run(config: SweepConfig) -> dict:
  """Runs a sweep end to end; returns the summary written to ``sweep.json``.

  Writes ``WORKDIR/sweep.json`` (members sorted by the eval metric, their
  hyperparameters, status and curves), ``curves.png`` and ``best/`` (an
  ordinary run: ``config.json``, ``checkpoints/``, ``final_metrics.json``).

  Raises:
    ConfigError, DataError: before anything is written; FileExistsError: the
    sweep directory exists. A sweep that fails midway removes its directory.
  """
  from purax.config import build_task, sample_batch
  from purax.io import datasets, pipeline
  config, seeds, hparams = config.validate()
  base = config.member_config(0, {n: v[0] for n, v in hparams.items()}, config.workdir)
  base.validate()
  ds = datasets.load(config.dataset, num_classes=config.num_classes)
  task = build_task(base, num_classes=ds.num_classes, input_shape=ds.input_shape)
  unique, batch_index = np.unique(seeds, return_inverse=True)
  train_data = _SeedBatches([pipeline.train_dataset(
      ds.x_train, ds.y_train, batch_size=config.batch_size, seed=int(u),
      num_steps=config.steps) for u in unique])
  expect(not os.path.exists(config.workdir), 'workdir', 'a directory that does not exist yet',
         repr(config.workdir), FileExistsError)
  sample = sample_batch(ds.x_train, ds.y_train, config.batch_size)
  pop = jax.jit(pop_lib.init, static_argnums=0)(task, _keys(jnp.asarray(seeds)), hparams, sample)
  os.makedirs(config.workdir)
  try:
    pop, history = run_population(
        task, pop, train_data, batch_index=None if len(unique) == 1 else jnp.asarray(batch_index, jnp.int32),
        eval_data=pipeline.eval_batches(ds.x_test, ds.y_test, batch_size=config.eval_batch_size),
        eval_every=config.eval_every, log_every=config.log_every, metric=config.metric,
        mode='min' if config.metric == 'loss' else 'max', patience=config.patience,
        pbt_every=config.pbt_every, pbt_fraction=config.pbt_fraction,
        pbt_key=jax.random.key(config.sample_seed), progress=config.progress)
    from purax import sweep_report
    summary = sweep_report.write(config, task, sample, pop, seeds, history)
  except BaseException:
    shutil.rmtree(config.workdir, ignore_errors=True)
    raise
  return summary
