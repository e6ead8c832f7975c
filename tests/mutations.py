"""A mutation round: one-line bugs injected into code users rely on, each run
against the tests that should catch it (issue 27.7). Not collected by pytest.

Each row is ``(file, the line's text, the bug, the tests)``; the script
applies one bug at a time to the working tree, runs its tests, restores the
file, and prints ``caught`` or ``SURVIVED`` per row and the count as JSON on
the last line. The first rows are the kinds issue 27 named; the rest are this
round's own.

Usage (from the repository root, on an idle machine; about 10 minutes on 2
cores): ``.venv/bin/python -m tests.mutations [--only SUBSTRING]``
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MUTATIONS = [
    # The kinds issue 27 named (one-line bugs that used to survive the suite).
    ('purax/core/update.py', 'jax.random.fold_in(key, i), summed=True',
     'jax.random.fold_in(key, 0), summed=True', 'tests/core/test_update.py'),
    ('purax/core/loss_scale.py', 'self.good_steps + 1 >= self.growth_interval',
     'self.good_steps >= self.growth_interval', 'tests/core/test_loss_scale.py'),
    ('purax/core/loss_scale.py', 'self.good_steps + 1 >= self.growth_interval',
     'self.good_steps + 2 >= self.growth_interval', 'tests/core/test_loss_scale.py'),
    ('purax/io/pipeline.py', 'permutation(first + 1)', 'permutation(first)',
     'tests/io/test_pipeline.py'),
    # This round's own.
    ('purax/core/metrics.py', 'return Average(self.total + other.total, self.count + other.count)',
     'return Average(self.total + other.total, self.count)', 'tests/core/test_metrics.py'),
    ('purax/core/metrics.py', 'count=jnp.sum(weights))', 'count=jnp.sum(jnp.ones_like(weights)))',
     'tests/core/test_metrics.py tests/io/test_pipeline.py'),
    ('purax/core/metrics.py', 'return Sum(self.value + other.value)', 'return Sum(other.value)',
     'tests/core/test_metrics.py'),
    ('purax/core/metrics.py', 'jnp.where(other.current > 0, self.current + other.current, 0)',
     'jnp.where(other.current > 0, other.current, 0)', 'tests/core/test_metrics.py'),
    ('purax/hooks/runner.py', 'return last // every > first // every', 'return last % every == 0',
     'tests/hooks/test_runner.py'),
    ('purax/hooks/runner.py', '    return evaluated\n', '    return True\n',
     'tests/hooks/test_runner.py'),
    ('purax/io/pipeline.py', 'weight[:real] = 1.0', 'weight[:] = 1.0', 'tests/io/test_pipeline.py'),
    ('purax/io/pipeline.py', 'np.random.default_rng([seed, epoch])', 'np.random.default_rng([seed, 0])',
     'tests/io/test_pipeline.py'),
    ('purax/core/update.py', 'return (grads_sum, state_sum, metrics, weight + w), None',
     'return (grads_sum, state_sum, metrics, weight), None', 'tests/core/test_update.py'),
    ('purax/core/update.py', 'weight = jax.lax.psum(weight, axis_name)', 'weight = weight',
     'tests/parallel/test_spmd.py'),
    ('purax/core/optim.py', 'return lambda count: learning_rate * unit(count)',
     'return lambda count: learning_rate * unit(count + 1)', 'tests/core/test_optim.py'),
    ('purax/core/loss_scale.py', 'self.scale * 0.5)', 'self.scale * 0.25)',
     'tests/core/test_update.py'),
    ('purax/core/update.py',
     "finite = (jnp.isfinite(grad_norm) & jnp.isfinite(metrics['loss'].total)",
     'finite = (jnp.isfinite(grad_norm)', 'tests/core/test_update.py'),
    ('purax/io/text.py', "return {'x': windows[:, :-1], 'y': windows[:, 1:]}",
     "return {'x': windows[:, :-1], 'y': windows[:, :-1]}", 'tests/io/test_text.py'),
    ('purax/io/datasets.py', 'expect(lo >= 0 and hi < ds.num_classes',
     'expect(lo >= 0 and hi <= ds.num_classes', 'tests/io/test_datasets.py'),
    ('purax/core/metrics.py', "  value = -value if mode == 'max' else value",
     '  value = value', 'tests/core/test_population.py tests/core/test_metrics.py'),
    ('purax/hooks/library.py', 'if score < self.best - self.min_delta:',
     'if score <= self.best - self.min_delta:', 'tests/hooks/test_library.py'),
    ('purax/hooks/library.py', 'stop = self.stale >= self.patience',
     'stop = self.stale > self.patience', 'tests/hooks/test_library.py'),
    ('purax/parallel/spmd.py', 'local = state.replace(rng=jax.random.fold_in(state.rng, index))',
     'local = state', 'tests/parallel/test_spmd.py'),
    ('purax/core/precision.py', "expect(_DTYPES[value] == jnp.float32, 'precision output',",
     "expect(True, 'precision output',", 'tests/core/test_precision.py'),
    ('purax/core/losses.py', ' & (earlier == 0)).astype(', ').astype(  # earlier',
     'tests/core/test_objectives.py'),
    ('purax/loop.py', "return isinstance(data, (list, tuple)) or getattr(data, 'fresh_batches', False) is True",
     'return True  # fresh', 'tests/test_loop.py'),
    ('purax/core/hparams.py', 'return node._replace(hyperparams={k: values.get(k, v)',
     'return node._replace(hyperparams={k: v', 'tests/core/test_optim.py tests/core/test_pbt.py'),
    # Issue 28.5: non-finite hyperparameters, refused by the setters, skipped by the guard.
    ('purax/core/update.py', '& hparams_lib.all_finite(state))', ')',
     'tests/core/test_update.py tests/core/test_population.py'),
    ('purax/core/hparams.py', 'if isinstance(value, jax.core.Tracer):', 'if True:',
     'tests/core/test_optim.py'),
    ('purax/core/population.py', '    hparams_lib.check(name, value)\n', '',
     'tests/core/test_population.py'),
    ('purax/core/optim.py', 'expect(math.isfinite(value), name,', 'expect(True, name,',
     'tests/core/test_optim.py'),
    ('purax/core/pbt.py', 'all(math.isfinite(f) and f > 0 for f in factors)',
     'all(f > 0 for f in factors)', 'tests/core/test_pbt.py'),
    ('purax/core/pbt.py',
     'np.clip(dict(bounds).get(name, hparams_lib.DEFAULT_BOUNDS.clip()), -_MAX, _MAX)',
     'dict(bounds).get(name, (0.0, np.inf))', 'tests/core/test_pbt.py'),
    # Issue 28.1/2/3/6: links, required integrity records, signals, restore_or_init.
    ('purax/io/checkpoint/manager.py', '      integrity.require_records(extra)\n', '',
     'tests/io/checkpoint/test_manager.py'),
    ('purax/io/export.py', "  expect(isinstance(want, str), f'{signature_path} sha256'",
     "  if want is None:\n    return path, payload\n  expect(isinstance(want, str), "
     "f'{signature_path} sha256'", 'tests/io/test_export.py'),
    ('purax/io/checkpoint/manager.py', '    integrity.check_step(extra, step)\n', '',
     'tests/io/checkpoint/test_manager.py'),
    ('purax/io/safe_files.py', 'os.O_NOFOLLOW | ', '', 'tests/io/test_safe_files.py'),
    ('purax/io/checkpoint/run.py', '  expect(not strangers,', '  expect(True,',
     'tests/io/checkpoint/test_run.py'),
    ('purax/io/signals.py', '  _pending.append(int(signum))\n', '',
     'tests/faults/test_faults.py -k each_phase'),
    ('purax/app/runs.py', '    if not polled and stop():', '    if False:',
     'tests/faults/test_faults.py -k each_phase'),
    # Issue 29: output, the learning rate, compile time, errors, summary, keep-best.
    ('purax/io/progress.py', '      write(record.getMessage(), sys.stdout)', '      pass',
     'tests/io/test_progress.py'),
    ('purax/core/optim.py', 'count = jnp.maximum(opt_state.count - 1, 0) if applied else',
     'count = opt_state.count if applied else', 'tests/hooks/test_builtin.py'),
    ('purax/hooks/window.py', '(hook_s - self.clock[2] - waited) - compile_s',
     '(hook_s - self.clock[2] - waited)', 'tests/hooks/test_window.py'),
    ('purax/io/writers.py', '  return counter and not np.any(np.asarray(value))',
     '  return False', 'tests/io/test_writers.py'),
    ('purax/app/fields.py', 'return item.metadata.get(COMPUTATION, not item.metadata.get(',
     'return True or item.metadata.get(COMPUTATION, not item.metadata.get(',
     'tests/app/test_fields.py'),
    ('purax/core/task.py', '      message = shapes.mismatch(self, params, batch)\n',
     '      message = None\n', 'tests/core/test_task.py'),
    ('purax/inspect/summary.py', '                      _shard_bytes(leaf)))',
     '                      _nbytes(leaf)))', 'tests/inspect/test_summary.py'),
    ('purax/io/checkpoint/policies.py', 'to_minimise(self.scores[c.step], self.rule.mode)',
     "to_minimise(self.scores[c.step], 'max')", 'tests/io/checkpoint/test_manager.py -k last_n'),
]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--only', default='', help='rows whose file or bug contains this')
  parser.add_argument('--skip', type=int, default=0, help='start at this row')
  args = parser.parse_args(argv)
  caught, survived = 0, []
  for path, line, bug, tests in MUTATIONS[args.skip:]:
    if args.only and args.only not in path + bug:
      continue
    full = os.path.join(ROOT, path)
    original = open(full).read()
    if line not in original:
      print(f'MISSING (the line moved): {path}: {line}')
      survived.append(f'{path}: {line} (missing)')
      continue
    try:
      with open(full, 'w') as f:
        f.write(original.replace(line, bug, 1))
      done = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-x', '-p', 'no:cacheprovider',
                             *tests.split()], cwd=ROOT, capture_output=True, text=True,
                            env=dict(os.environ, PURAX_HYPOTHESIS_PROFILE='mutation'))
    finally:
      with open(full, 'w') as f:
        f.write(original)
    if done.returncode != 0:
      caught += 1
      print(f'caught: {path}: {line.strip()} -> {bug.strip()}', flush=True)
    else:
      survived.append(f'{path}: {line.strip()} -> {bug.strip()}')
      print(f'SURVIVED: {survived[-1]}', flush=True)
  total = caught + len(survived)
  print(json.dumps({'caught': caught, 'total': total, 'survived': survived}))
  return 0


if __name__ == '__main__':
  sys.exit(main())
