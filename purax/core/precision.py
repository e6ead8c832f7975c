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
:mod:`purax.core.loss_scale`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from purax.core.errors import ConfigError, expect

_DTYPES = {'float32': jnp.float32, 'f32': jnp.float32, 'bfloat16': jnp.bfloat16,
           'bf16': jnp.bfloat16, 'float16': jnp.float16, 'f16': jnp.float16,
           'half': jnp.float16, 'float64': jnp.float64}
_FIELDS = {'params': 'param_dtype', 'param': 'param_dtype', 'p': 'param_dtype',
           'compute': 'compute_dtype', 'c': 'compute_dtype',
           'output': 'output', 'o': 'output'}


@dataclasses.dataclass(frozen=True)
class Policy:
  """Storage and compute dtypes (model outputs reach the loss as float32).

  Attributes:
    param_dtype: dtype params are stored (and updated) in: float32 or bfloat16
      (float16 is refused: it cannot train).
    compute_dtype: dtype of activations and matmuls.
  """

  param_dtype: jnp.dtype = jnp.float32
  compute_dtype: jnp.dtype = jnp.float32

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

  def model_kwargs(self) -> dict:
    """``{'dtype': compute, 'param_dtype': params}`` for purax.nn models."""
    return {'dtype': self.compute_dtype, 'param_dtype': self.param_dtype}

  def __str__(self):
    name = lambda d: jnp.dtype(d).name
    return (f'params={name(self.param_dtype)},compute={name(self.compute_dtype)},'
            'output=float32')


PRESETS = {
    'fp32': Policy(),
    'bf16': Policy(compute_dtype=jnp.bfloat16),
    'fp16': Policy(compute_dtype=jnp.float16),
}


def get_policy(spec: str | Policy) -> Policy:
  """A policy from a preset name (``fp32``, ``bf16``, ``fp16``) or a jmp-style string.

  Example:
    >>> from purax.core.precision import get_policy
    >>> get_policy('params=float32,compute=bfloat16,output=float32') == get_policy('bf16')
    True

  Raises:
    ConfigError: unknown preset, field or dtype, naming it; float16 params
      (they cannot train: float16 compute with float32 params can); an output
      dtype other than float32 (losses are computed in float32).
  """
  if isinstance(spec, Policy):
    return spec
  spec = spec.strip()
  if spec in PRESETS:
    return PRESETS[spec]
  expect('=' in spec, 'precision', f'one of {sorted(PRESETS)} or '
         "'params=DTYPE,compute=DTYPE'", repr(spec), ConfigError)
  values = {}
  for part in spec.split(','):
    key, _, value = part.partition('=')
    key, value = key.strip(), value.strip()
    expect(key in _FIELDS, 'precision field', "one of 'params', 'compute', 'output'",
           repr(key), ConfigError)
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
  return Policy(**values)
