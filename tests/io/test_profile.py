"""purax.io.profile: a trace of exactly the chosen steps, each annotated."""

import glob
import gzip
import json
import os

import jax
import jax.numpy as jnp
import pytest

from purax.core.errors import ConfigError
from purax.io import profile


def traced_steps(logdir):
  """Step numbers of the 'train' step annotations in the one trace under logdir."""
  (trace,) = glob.glob(os.path.join(logdir, 'plugins', 'profile', '*', 'perfetto_trace.json.gz'))
  assert glob.glob(os.path.join(os.path.dirname(trace), '*.xplane.pb'))   # TensorBoard / xprof
  with gzip.open(trace) as f:
    events = json.load(f)
  events = events['traceEvents'] if isinstance(events, dict) else events
  return sorted(int(e['args']['step_num']) for e in events if e.get('name') == profile.STEP_NAME)


def matmul_loop():
  f = jax.jit(lambda x: jnp.tanh(x @ x))
  x = jnp.ones((32, 32))
  return f, x


def test_step_context_traces_start_to_stop_with_one_annotation_per_step(tmp_path):
  f, x = matmul_loop()
  profiler = profile.Profiler(tmp_path, start=2, stop=5, memory_profile=True)
  for s in range(8):
    with profiler.step(s, block=lambda: x):
      x = f(x)
  profiler.close()
  assert traced_steps(tmp_path) == [2, 3, 4]
  assert os.path.getsize(tmp_path / profile.MEMORY_PROFILE) > 0


def test_close_ends_a_trace_cut_short(tmp_path):
  f, x = matmul_loop()
  profiler = profile.Profiler(tmp_path, start=0, stop=100)
  for s in range(3):
    with profiler.step(s):
      x = f(x)
  profiler.close(x)
  assert traced_steps(tmp_path) == [0, 1, 2]
  assert not profiler.active


@pytest.mark.parametrize('text', ['5', '8:5', '5:5', 'a:b', '-1:3', '1:2:3'])
def test_bad_range_names_the_field(text):
  with pytest.raises(ConfigError, match=r"profile: expected .*START.*got '"):
    profile.parse_range(text)


def test_parse_range():
  assert profile.parse_range('5:8') == (5, 8)


def test_a_memory_profile_is_never_written_through_a_link(tmp_path):
  """Issue 28.1: a link at memory.prof is refused, its target left unchanged."""
  victim = tmp_path / 'victim'
  victim.write_text('precious')
  (tmp_path / profile.MEMORY_PROFILE).symlink_to(victim)
  with pytest.raises(ConfigError, match=r'memory\.prof: expected a regular file .*symlink'):
    profile.save_memory_profile(str(tmp_path / profile.MEMORY_PROFILE))
  assert victim.read_text() == 'precious'
