"""Issue 27.3: every precision policy the parser accepts trains; the one that
cannot (float16 params: the optimizer's arithmetic in float16) is refused."""

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purax
from purax.core.precision import Policy, get_policy
from purax.io import datasets, pipeline

DTYPES = ('float32', 'bfloat16', 'float16')
ACCEPTED = [f'params={p},compute={c},output=float32'
            for p, c in itertools.product(('float32', 'bfloat16'), DTYPES)]
DS = datasets.load('digits')
TRAIN = pipeline.train_dataset(DS.x_train, DS.y_train, batch_size=64, seed=0, num_steps=20)
EVAL = {'x': DS.x_test, 'y': DS.y_test}


def eval_loss_after_training(spec: str, steps: int = 20) -> float:
  policy = get_policy(spec)
  task = purax.Task(model=purax.nn.MLP(num_classes=10, features=(64,), **policy.model_kwargs()),
                    tx=purax.adamw(learning_rate=1e-2, total_steps=steps, warmup_steps=2),
                    loss_scale=2.0 ** 15 if policy.needs_loss_scaling else None)
  state = task.init(jax.random.key(0), TRAIN[0])
  step = jax.jit(lambda s, b: task.step(s, b)[0])
  for i in range(steps):
    state = step(state, TRAIN[i])
  return float(purax.metrics.compute(task.evaluate(state, EVAL))['loss'])


@pytest.fixture(scope='module')
def fp32_loss():
  return eval_loss_after_training('fp32')


@pytest.mark.parametrize('spec', ACCEPTED)
def test_every_accepted_policy_trains_as_float32_does(spec, fp32_loss):
  """From 2.30 (chance) at init to 1.17 after 20 steps in float32; every policy
  below 1.5 and within 0.3 of it (bfloat16 storage rounds the smallest updates
  away: 1.40; float16 params, which diverged to 776435, are refused below)."""
  assert fp32_loss == pytest.approx(1.166, abs=0.01)
  loss = eval_loss_after_training(spec)
  assert loss < 1.5 and abs(loss - fp32_loss) < 0.3, (spec, loss)


@pytest.mark.parametrize('spec', ['params=float16', 'params=f16,compute=float16',
                                  'params=half,compute=float32,output=float32'])
def test_float16_params_are_refused_by_name(spec):
  with pytest.raises(purax.ConfigError, match=r"precision params: expected float32 or "
                                              r"bfloat16 \(float16 params cannot train"):
    get_policy(spec)
  with pytest.raises(purax.ConfigError, match='precision params'):
    Policy(param_dtype=np.float16)


@pytest.mark.parametrize('value', ['bfloat16', 'float16'])
def test_an_output_dtype_other_than_float32_is_refused_not_ignored(value):
  """Losses are computed in float32 from the model outputs: a narrower output
  dtype would have no effect, so it is refused by name."""
  with pytest.raises(purax.ConfigError, match=rf"precision output: expected float32 "
                                              rf"\(losses are computed in float32.*got '{value}'"):
    get_policy(f'params=float32,compute=bfloat16,output={value}')
  assert str(get_policy('compute=bf16,output=f32')) == \
      'params=float32,compute=bfloat16,output=float32'



def test_auto_is_float32_on_the_cpu_and_bf16_compute_with_float32_params_elsewhere(monkeypatch):
  from purax.core import precision
  assert precision.platform() == 'cpu'
  assert get_policy('auto') == Policy() and precision.canonical('auto') == 'fp32'
  for name in ('gpu', 'tpu'):
    monkeypatch.setattr(precision, 'platform', lambda: name)
    policy = get_policy('auto')
    assert (policy.param_dtype, policy.compute_dtype, policy.fp8) == (np.float32, jnp.bfloat16,
                                                                      False)
    assert precision.canonical(' auto') == 'bf16'
  # One name per policy: a spelled-out preset is recorded as the preset.
  assert precision.canonical('params=float32,compute=bfloat16,output=float32') == 'bf16'
  assert precision.canonical('params=bfloat16,compute=bfloat16') == \
      'params=bfloat16,compute=bfloat16,output=float32'


def test_fp8_is_a_preset_and_a_matmul_field_of_a_16_bit_compute_policy():
  fp8 = get_policy('fp8')
  assert fp8.fp8 and fp8.compute_dtype == jnp.bfloat16 and fp8.param_dtype == jnp.float32
  h100 = Device('gpu', 'NVIDIA H100 80GB HBM3', '9.0')
  assert fp8.model_kwargs(device=h100) == {'dtype': jnp.bfloat16, 'param_dtype': jnp.float32,
                                           'fp8': True}
  assert get_policy(str(fp8)) == fp8 and str(fp8) == \
      'params=float32,compute=bfloat16,matmul=float8,output=float32'
  assert 'fp8' not in get_policy('bf16').model_kwargs()
  with pytest.raises(purax.ConfigError, match=r'precision matmul: expected float8 only with '
                                              r'compute=bfloat16 or float16'):
    get_policy('compute=float32,matmul=float8')
  with pytest.raises(purax.ConfigError, match=r"precision matmul: expected one of"):
    get_policy('compute=bf16,matmul=int4')


class Device:
  """What float8_upcast reads of a jax.Device."""

  def __init__(self, platform, device_kind, compute_capability=None):
    self.platform, self.device_kind = platform, device_kind
    if compute_capability is not None:
      self.compute_capability = compute_capability


@pytest.mark.parametrize('device, upcast', [
    (Device('gpu', 'NVIDIA H100 80GB HBM3', '9.0'), None),
    (Device('gpu', 'NVIDIA L4', '8.9'), None),                  # Ada
    (Device('gpu', 'NVIDIA B200', '10.0'), None),
    (Device('gpu', 'NVIDIA A100-SXM4-80GB', '8.0'),
     'gpu (NVIDIA A100-SXM4-80GB, compute capability 8.0)'),
    (Device('gpu', 'AMD Instinct MI300X', 'gfx942'), 'compute capability gfx942'),
    (Device('tpu', 'TPU v5 lite'), 'tpu (TPU v5 lite)'),
    (None, 'cpu (cpu)'),                                        # this process's device
])
def test_float8_matmuls_warn_where_xla_would_upcast_them(device, upcast):
  from purax.core import precision
  reason = precision.float8_upcast(device)
  fp8, bf16 = get_policy('fp8'), get_policy('bf16')
  if upcast is None:
    assert reason is None
    with warnings.catch_warnings():
      warnings.simplefilter('error')
      assert fp8.model_kwargs(device=device)['fp8']
    return
  assert upcast in reason and 'XLA upcasts float8 matmuls' in reason
  # The model is built all the same (it trains, at no float8 speed), with a
  # named warning, one line under the command line (it starts with 'purax:').
  with pytest.warns(purax.core.errors.Float8UpcastWarning,
                    match=r'^purax: precision params=float32,compute=bfloat16,matmul=float8,'
                          r'output=float32: on .*8\.9\+'):
    assert fp8.model_kwargs(device=device)['fp8']
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    bf16.model_kwargs(device=device)           # no float8 asked: nothing to say
