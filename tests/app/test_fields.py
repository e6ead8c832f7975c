"""The config fields' metadata (purax.app.fields): which fields may change when
a run resumes (those that do not change the computation, and --steps,
--decay-steps to train longer), the cadences, and TensorBoard's HParams read
from the same metadata."""

from purax.app import fields as purax_fields


def test_which_fields_may_change_on_resume_is_read_from_the_fields():
  """The fields' metadata (purax.app.fields) says which may differ when a run
  resumes: exactly those that do not change the computation (and --steps,
  --decay-steps to train longer)."""
  from purax.app import config as config_lib
  assert config_lib.resumable_changes() == {
      'run.workdir', 'run.progress', 'run.log_every', 'run.eval_every', 'data.eval_batch_size',
      'run.checkpoint_every', 'run.checkpoint_interval_s', 'run.keep_last', 'run.keep_best',
      'run.mesh', 'run.coordinator', 'run.num_processes', 'run.process_id',
      'optimizer.max_consecutive_skips', 'run.debug_nans', 'run.dry_run', 'run.profile',
      'run.profile_memory', 'run.wandb_project', 'run.steps_per_call', 'run.histograms',
      'run.steps', 'run.decay_steps', 'run.best_metric', 'run.best_mode', 'run.patience',
      # --fit-memory's choice lives in model/optimizer/run fields that must match
      'run.fit_memory', 'run.memory_budget', 'run.fit_memory_precisions',
      'run.time_budget', 'run.plan_decay'}   # each invocation's own budget; its plan: decay_steps
  assert purax_fields.names(config_lib.RunConfig, purax_fields.CADENCE) == (
      'log_every', 'eval_every', 'checkpoint_every', 'ema_every', 'histograms')


def test_hparams_are_the_fields_that_change_the_computation():
  """Issue 29.4: TensorBoard's HParams come from the same metadata: the fields
  that must match on resume, plus --steps, --decay-steps and --patience (which
  may change on resume, to train on, and still change what is computed)."""
  from purax.app import config as config_lib
  config = config_lib.TrainConfig()
  hparams = config.hparams()
  schedule = {'schedule', 'decay_start', 'cooldown_steps'}     # --schedule wsd's (issue 48.1)
  assert schedule <= set(hparams)
  assert set(hparams) - schedule == {
      'model', 'dropout_rate', 'd_model', 'num_layers', 'num_heads', 'remat', 'scan_layers',
      'precision', 'dataset', 'batch_size', 'seq_len', 'num_classes', 'loss', 'learning_rate',
      'weight_decay', 'b1', 'b2', 'clip_norm', 'label_smoothing', 'warmup_steps',
      'microbatches', 'loss_scale', 'seed', 'ema_decay', 'ema_every', 'steps', 'decay_steps',
      'patience', 'optimizer', 'weight_decay_mask', 'momentum', 'z_loss', 'spike_k',
      'spike_window', 'spike_rollback', 'spike_action', 'spike_lr_scale', 'spike_lr_steps'}
  resumable = {name.split('.')[1] for name in config_lib.resumable_changes()}
  assert set(config.flat()) - set(hparams) == resumable - {'steps', 'decay_steps', 'patience'}
  assert {'dry_run', 'progress', 'workdir', 'debug_nans', 'profile_memory'}.isdisjoint(hparams)
