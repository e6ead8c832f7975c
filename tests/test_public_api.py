"""The public API is a promise (docs/versions.md): every public name and
signature is recorded; a change since the last release is named in
CHANGELOG.md; every name of the last release still resolves; the spellings
before 0.2 that research scripts used run with a DeprecationWarning naming the
replacement, and give what the new spelling gives."""

import json
import os
import re
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest

import purax
from tests.api_snapshot import PACKAGES
from tests.helpers import tiny_batch, tiny_task, tree_equal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASED = os.path.join(ROOT, 'tests', 'fixtures', 'public_api_0.2.0.json')


def changelog_section(version: str) -> str:
  """The text of CHANGELOG.md's section of ``version`` (up to the next section)."""
  text = open(os.path.join(ROOT, 'CHANGELOG.md'), encoding='utf-8').read()
  match = re.search(rf'^## \[{re.escape(version)}\].*?(?=^## \[|\Z)', text, re.M | re.S)
  assert match, f'CHANGELOG.md: expected a section "## [{version}]", got none'
  return match.group(0)


def changed_names(released: dict, now: dict) -> list[str]:
  """The public names added, removed or of another signature since ``released``."""
  return sorted(k for k in set(released) | set(now) if released.get(k) != now.get(k))


def unnamed(names, section: str) -> list[str]:
  """Those of ``names`` that ``section`` does not name in backticks (``purax.x``)."""
  return [n for n in names if f'`{n}`' not in section and f'`{n}(' not in section]


def fresh_snapshot() -> dict:
  """The public API as a fresh interpreter imports it (no other test's state)."""
  done = subprocess.run([sys.executable, '-m', 'tests.api_snapshot', '-'], cwd=ROOT,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout)


def test_every_change_since_the_last_release_is_named_in_the_changelog():
  released = json.load(open(RELEASED))
  missing = unnamed(changed_names(released, fresh_snapshot()),
                    changelog_section(purax.__version__))
  assert not missing, (
      f'public names changed since 0.2.0 without an entry in CHANGELOG.md [{purax.__version__}]:'
      f' {missing} (add each, by its full name in backticks; docs/versions.md)')


def test_the_check_fails_on_a_signature_changed_without_an_entry():
  """The check itself: a changed signature (simulated on the recorded API) and a
  new name are caught; named in the section, they pass."""
  released = json.load(open(RELEASED))
  now = dict(released, **{'purax.evaluate': '(task, state, batches, *, plan=None, fast=True)',
                          'purax.brand_new': '()'})
  changed = changed_names(released, now)
  assert changed == ['purax.brand_new', 'purax.evaluate']
  assert unnamed(changed, '## [9.9]\n- `purax.fit` changed') == changed
  assert unnamed(changed, '- `purax.evaluate` gained `fast`; `purax.brand_new()`') == []


def test_every_name_of_the_last_release_still_resolves():
  """A removal or rename keeps the old spelling for one minor version."""
  released = json.load(open(RELEASED))
  for name in released:
    package, attr = name.rsplit('.', 1)
    module = purax if package == 'purax' else None
    for part in package.split('.')[1:]:
      module = getattr(module or purax, part) if module is not None else getattr(purax, part)
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', DeprecationWarning)
      assert hasattr(module, attr), f'{name} of 0.2.0 no longer resolves'


def test_all_lists_resolve_and_are_what_the_record_reads():
  import importlib
  for package in PACKAGES:
    if package in ('purax.metrics', 'purax.objectives'):
      continue
    module = importlib.import_module(package)
    assert isinstance(module.__all__, list) and len(module.__all__) == len(set(module.__all__))
    for name in module.__all__:
      assert hasattr(module, name), f'{package}.__all__ names {name}, which is not there'


# -- the spellings before 0.2 ------------------------------------------------------------

TASK = tiny_task('mlp', total_steps=8)
DATA = [tiny_batch(seed=s) for s in range(8)]


def fresh():
  return jax.jit(TASK.init)(jax.random.key(0), DATA[0])


def test_fit_keywords_before_0_2_map_onto_the_hooks_with_a_warning(tmp_path):
  """fit(eval_data=, log_every=, checkpointer=) as a script of 0.1 wrote it:
  a DeprecationWarning naming purax.hooks.standard, and the same training,
  history and checkpoint as the new spelling."""
  with pytest.warns(DeprecationWarning, match=r'fit\(eval_data=, log_every=, checkpointer=\.\.\.\)'
                    r' is deprecated since 0.2 .*hooks=purax.hooks.standard\(eval_data=\.\.\., '
                    r'log_every=\.\.\., checkpointer=\.\.\.\)'):
    with purax.Checkpointer(str(tmp_path / 'old')) as ckpt:
      old, old_history = purax.fit(TASK, fresh(), DATA, steps=8, eval_data=DATA[:2],
                                   log_every=4, checkpointer=ckpt)
  with purax.Checkpointer(str(tmp_path / 'new')) as ckpt:
    new, new_history = purax.fit(TASK, fresh(), DATA, steps=8, hooks=purax.hooks.standard(
        eval_data=DATA[:2], log_every=4, checkpointer=ckpt))
  assert tree_equal(jax.tree.map(np.asarray, old.params), jax.tree.map(np.asarray, new.params))
  strip = lambda h: [{k: v for k, v in r.items() if k not in ('steps_per_sec', 'compile_s')}
                     for r in h]
  assert strip(old_history) == strip(new_history) and old_history.end == new_history.end
  assert sorted(os.listdir(tmp_path / 'old')) == sorted(os.listdir(tmp_path / 'new')) == ['8']
  with pytest.raises(TypeError, match="unexpected keyword argument 'eval_dataa'"):
    purax.fit(TASK, fresh(), DATA, eval_dataa=DATA)


def test_plan_population_and_set_hyperparams_of_an_opt_state_before_0_2():
  with pytest.warns(DeprecationWarning, match=r'purax.plan.Population is deprecated: use '
                                              r'purax.plan.PopulationPlan'):
    population = purax.plan.Population
  assert population is purax.plan.PopulationPlan
  with pytest.warns(DeprecationWarning, match='purax.parallel.Sharded is deprecated'):
    assert purax.parallel.Sharded is purax.plan.ShardedPlan
  state = fresh()
  with pytest.warns(DeprecationWarning, match=r'set_hyperparams\(opt_state, \.\.\.\) is '
                                              r'deprecated since 0.2 .*set_hyperparams\(state'):
    opt_state = purax.set_hyperparams(state.opt_state, learning_rate=3e-4)
  new = purax.set_hyperparams(state, learning_rate=3e-4)
  assert tree_equal(opt_state, new.opt_state)
  with pytest.warns(DeprecationWarning, match=r'purax.hooks.Loop is deprecated: use purax.hooks.StepInfo'):
    purax.hooks.Loop
