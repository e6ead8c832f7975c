"""Mixed-precision policies: which dtype params are stored and computed in.

The convention of jmp (DeepMind): ``params=float32,compute=bfloat16,output=float32``.
purax applies a policy through the models' ``param_dtype`` (storage) and
``dtype`` (compute; inputs are cast on entry). Whatever the policy, losses,
softmax normalisers and normalisation moments are computed in float32 from the
model's outputs, so the output dtype is always float32: ``output=float32`` is
accepted for jmp's spelling, any other output dtype is refused (it would have
no effect). Master params, optimizer state and hyperparameters stay float32
unless the policy stores params in bfloat16 on purpose.

Presets: ``fp32`` (all float32), ``bf16`` (params float32, compute bfloat16,
output float32), ``fp16`` (the same with float16; needs loss scaling, see
:mod:`purax.core.loss_scale`), ``fp8`` (``bf16`` with the large matmuls of
the models that support it in float8: inputs and weights in e4m3, their
gradients in e5m2, each scaled by its current absolute maximum;
``matmul=float8`` in a jmp-style string; :mod:`purax.nn.fp8`: float8 GEMMs
on NVIDIA GPUs of compute capability 8.9+; elsewhere XLA upcasts them and
:meth:`Policy.model_kwargs` warns, :class:`~purax.core.errors.Float8UpcastWarning`,
:func:`float8_upcast`). ``auto``
resolves for the platform the run is on (:func:`resolve`): ``bf16`` on a GPU
or TPU (their matrix units run bfloat16 at several times the float32 rate),
``fp32`` on the CPU (no bfloat16 matmul speed-up, and the suite's bitwise
properties are stated in float32); a run records the policy it resolved to
(:func:`canonical`), so a resume compares policies, not the word ``auto``.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Callable

import jax
import jax.numpy as jnp

from purax.core.errors import ConfigError, Float8UpcastWarning, expect

_DTYPES = {'float32': jnp.float32, 'f32': jnp.float32, 'bfloat16': jnp.bfloat16,
           'bf16': jnp.bfloat16, 'float16': jnp.float16, 'f16': jnp.float16,
           'half': jnp.float16, 'float64': jnp.float64}
_FIELDS = {'params': 'param_dtype', 'param': 'param_dtype', 'p': 'param_dtype',
           'compute': 'compute_dtype', 'c': 'compute_dtype',
           'output': 'output', 'o': 'output', 'matmul': 'matmul'}
#: Values of the ``matmul`` field: float8 matmuls, or the compute dtype's.
_MATMUL = {'float8': True, 'fp8': True, 'f8': True, 'compute': False}

#: The platforms whose ``auto`` policy computes in bfloat16 (``jax.default_backend()``).
BF16_PLATFORMS = ('gpu', 'cuda', 'rocm', 'tpu')


@dataclasses.dataclass(frozen=True)
class Policy:
  """Storage and compute dtypes (model outputs reach the loss as float32).

  Attributes:
    param_dtype: dtype params are stored (and updated) in: float32 or bfloat16
      (float16 is refused: it cannot train).
    compute_dtype: dtype of activations and matmuls.
    fp8: the large matmuls in float8 (:mod:`purax.nn.fp8`; models with an
      ``fp8`` field: the transformers), the rest in ``compute_dtype``.
  """

  param_dtype: jnp.dtype = jnp.float32
  compute_dtype: jnp.dtype = jnp.float32
  fp8: bool = False

  def __post_init__(self):
    # float16 storage would be the optimizer's arithmetic too (optax keeps its
    # moments in the params' dtype): Adam's second moment underflows and the
    # updates round away, so such a run diverges while reporting success.
    expect(jnp.dtype(self.param_dtype) != jnp.float16, 'precision params',
           "float32 or bfloat16 (float16 params cannot train: keep them float32 and "
           "compute in float16, 'params=float32,compute=float16' or the preset 'fp16')",
           "'float16'", ConfigError)

  @property
  def needs_loss_scaling(self) -> bool:
    """float16 gradients underflow without a loss scale (Micikevicius et al. 2018)."""
    return jnp.dtype(self.compute_dtype) == jnp.float16 or \
        jnp.dtype(self.param_dtype) == jnp.float16

  def model_kwargs(self, *, device=None) -> dict:
    """``{'dtype': compute, 'param_dtype': params}`` for purax.nn models, and
    ``'fp8': True`` when the policy asks for float8 matmuls.

    Args:
      device: the ``jax.Device`` the model will run on (default:
        ``jax.devices()[0]``); asked only with float8 matmuls.

    Warns:
      Float8UpcastWarning: float8 matmuls on a device where XLA upcasts
        them (:func:`float8_upcast`): the model is built all the same (it
        trains, with float8 rounding, at no float8 speed).
    """
    if self.fp8:
      reason = float8_upcast(device)
      if reason:
        warnings.warn(f'purax: precision {self}: {reason}', Float8UpcastWarning,
                      stacklevel=2)
    return {'dtype': self.compute_dtype, 'param_dtype': self.param_dtype,
            **({'fp8': True} if self.fp8 else {})}

  def __str__(self):
    name = lambda d: jnp.dtype(d).name
    return (f'params={name(self.param_dtype)},compute={name(self.compute_dtype)},'
            + ('matmul=float8,' if self.fp8 else '') + 'output=float32')


#: The compute capability from which XLA:GPU runs float8 dots as cuBLASLt
#: float8 GEMMs (Ada 8.9, Hopper 9.0 and later).
FLOAT8_CAPABILITY = (8, 9)


def float8_upcast(device=None) -> str | None:
  """Why a float8 ``dot_general`` would not run as a float8 GEMM on
  ``device`` (default: ``jax.devices()[0]``), or ``None`` where it would:
  an NVIDIA GPU of compute capability 8.9 or later. Elsewhere XLA upcasts
  the float8 operands (XLA:CPU computes the products in float32 from the
  float8 values: the same numbers to rounding, no float8 speed).

  Example:
    >>> from purax.core.precision import float8_upcast
    >>> reason = float8_upcast()     # on a CPU: 'on cpu (cpu) XLA upcasts ...'
    >>> reason is None or 'XLA upcasts float8 matmuls' in reason
    True
  """
  device = jax.devices()[0] if device is None else device
  capability = getattr(device, 'compute_capability', None)
  if device.platform in ('gpu', 'cuda') and capability is not None:
    try:
      if tuple(int(p) for p in str(capability).split('.')[:2]) >= FLOAT8_CAPABILITY:
        return None
    except ValueError:          # not CUDA's 'major.minor' (ROCm's 'gfx942')
      pass
  where = f'{device.platform} ({device.device_kind}' + (
      f', compute capability {capability})' if capability is not None else ')')
  return (f'on {where} XLA upcasts float8 matmuls: float8 GEMMs need an NVIDIA GPU of '
          'compute capability 8.9+ (Ada, Hopper); the step trains with float8 rounding at '
          'no float8 speed')


PRESETS = {
    'fp32': Policy(),
    'bf16': Policy(compute_dtype=jnp.bfloat16),
    'fp16': Policy(compute_dtype=jnp.float16),
    'fp8': Policy(compute_dtype=jnp.bfloat16, fp8=True),
}

#: The preset that ``auto`` resolves to, by platform kind.
AUTO = {'accelerator': 'bf16', 'cpu': 'fp32'}


def platform() -> str:
  """The platform ``auto`` resolves for: ``jax.default_backend()``."""
  return jax.default_backend()


def resolve(spec: str, platform_name: str | None = None) -> str:
  """``spec`` with ``auto`` replaced by its preset for ``platform_name``
  (default: :func:`platform`): ``'bf16'`` on a GPU or TPU, ``'fp32'`` on the
  CPU; any other spec as it is."""
  if not isinstance(spec, str) or spec.strip() != 'auto':
    return spec
  name = platform() if platform_name is None else platform_name
  return AUTO['accelerator' if name in BF16_PLATFORMS else 'cpu']


def canonical(spec: str, platform_name: str | None = None) -> str:
  """The name a run records for ``spec``: ``auto`` resolved (:func:`resolve`),
  then the preset of the same policy if there is one (``'params=float32,
  compute=bfloat16'`` is ``'bf16'``), else the policy's full string; so two
  spellings of one policy compare equal on resume.

  Raises:
    ConfigError: as :func:`get_policy`.
  """
  policy = get_policy(resolve(spec, platform_name))
  return next((name for name, preset in PRESETS.items() if preset == policy), str(policy))


def get_policy(spec: str | Policy, platform_name: str | None = None) -> Policy:
  """A policy from a preset name (``fp32``, ``bf16``, ``fp16``, ``fp8``), ``auto``
  (:func:`resolve`, for ``platform_name`` or this process's platform) or a
  jmp-style string.

  Example:
    >>> from purax.core.precision import get_policy
    >>> get_policy('params=float32,compute=bfloat16,output=float32') == get_policy('bf16')
    True
    >>> get_policy('auto', 'gpu') == get_policy('bf16'), get_policy('auto', 'cpu') == get_policy('fp32')
    (True, True)

  Raises:
    ConfigError: unknown preset, field or dtype, naming it; float16 params
      (they cannot train: float16 compute with float32 params can); an output
      dtype other than float32 (losses are computed in float32); float8
      matmuls without a 16-bit compute dtype.
  """
  if isinstance(spec, Policy):
    return spec
  expect(isinstance(spec, str), 'precision', 'a preset name or a jmp-style string',
         repr(spec), ConfigError)
  spec = resolve(spec.strip(), platform_name)
  if spec in PRESETS:
    return PRESETS[spec]
  expect('=' in spec, 'precision', f"one of {sorted(PRESETS) + ['auto']} or "
         "'params=DTYPE,compute=DTYPE'", repr(spec), ConfigError)
  values = {}
  for part in spec.split(','):
    key, _, value = part.partition('=')
    key, value = key.strip(), value.strip()
    expect(key in _FIELDS, 'precision field', "one of 'params', 'compute', 'matmul', 'output'",
           repr(key), ConfigError)
    if _FIELDS[key] == 'matmul':
      expect(value in _MATMUL, 'precision matmul', f'one of {sorted(_MATMUL)}', repr(value),
             ConfigError)
      values['fp8'] = _MATMUL[value]
      continue
    expect(value in _DTYPES, f'precision {key}', f'one of {sorted(set(_DTYPES))}',
           repr(value), ConfigError)
    # Without jax_enable_x64 jax silently makes float64 arrays float32.
    expect(_DTYPES[value] != jnp.float64 or jax.config.jax_enable_x64, f'precision {key}',
           'float32, bfloat16 or float16 (float64 needs JAX_ENABLE_X64=1; without it '
           'jax would silently compute in float32)', repr(value), ConfigError)
    if _FIELDS[key] == 'output':
      expect(_DTYPES[value] == jnp.float32, 'precision output',
             'float32 (losses are computed in float32 from the model outputs, whatever '
             'the compute dtype; drop the output field)', repr(value), ConfigError)
      continue
    values[_FIELDS[key]] = _DTYPES[value]
  policy = Policy(**values)
  expect(not policy.fp8 or jnp.dtype(policy.compute_dtype) in (jnp.bfloat16, jnp.float16),
         'precision matmul', 'float8 only with compute=bfloat16 or float16 (the dtype the '
         'float8 products are accumulated and returned in)',
         f'matmul=float8 with compute={jnp.dtype(policy.compute_dtype).name}', ConfigError)
  return policy


def standard_promotion(fn: Callable) -> Callable:
  """``fn`` run under jax's standard dtype promotion, which optax and jax's
  own kernels assume: optax promotes its int32 ``count`` against floats
  (``b1 ** count`` in adam's bias correction) and bfloat16 parameters against
  float32 updates, ``jax.nn.dot_product_attention`` bfloat16 against its
  float32 logits. purax's optimizers, schedules, the step's update and the
  XLA attention run through it, so they also trace under
  ``jax_numpy_dtype_promotion='strict'`` (the test suite's setting).
  """
  @functools.wraps(fn)
  def promoted(*args, **kwargs):
    with jax.numpy_dtype_promotion('standard'):
      return fn(*args, **kwargs)
  return promoted
