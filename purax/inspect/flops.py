"""Model FLOPs per token, peak FLOP/s by device, and MFU.

Model FLOPs utilisation (MFU) is the throughput a run reaches in model FLOPs
divided by the hardware's peak (Chowdhery et al. 2022, "PaLM", Appendix B).
The count per token of a decoder-only Transformer, training (forward and
backward):

    flops_per_token = 6 * N + 12 * L * d * T

- ``6 * N``: every parameter takes part in one multiply-add (2 FLOPs) per
  token in the forward pass and two in the backward pass (Kaplan et al.
  2020, Sec. 2.1; Hoffmann et al. 2022, "Chinchilla", Appendix F). ``N``
  counts the parameters that do matmuls: with tied embeddings the token
  table is counted (it is the output projection), a learned position table is
  not (nanoGPT's ``estimate_mfu`` convention).
- ``12 * L * d * T``: attention's ``Q K^T`` and ``A V`` products, ``2 * 2 *
  T * d`` FLOPs per token and layer forward, three times that with the
  backward pass; ``L`` layers, ``d = heads * head_dim`` (d_model), ``T`` the
  sequence length. As in PaLM, the causal mask is not discounted, so MFU
  figures compare with PaLM's and nanoGPT's.

Rematerialisation is not counted (that would be hardware FLOPs utilisation).

Peaks are dense (no 2:4 sparsity) bfloat16/float16 tensor-core figures from
the vendors' data sheets. A device kind not in :data:`PEAK_BF16_TFLOPS`, a
CPU, or a float32 run (whose peak depends on TF32 settings) has no peak:
:func:`mfu` returns None rather than a wrong number.
"""

from __future__ import annotations

import re

import jax.numpy as jnp

#: Dense bf16/fp16 peak TFLOP/s by device kind substring (``jax.Device.
#: device_kind``), most specific first. NVIDIA data sheets (SXM parts unless
#: named); Google Cloud TPU documentation (per chip).
#: Keys match whole words; ``None`` marks a kind recognised as unknown (a
#: more general key would otherwise give it a wrong peak).
PEAK_BF16_TFLOPS: tuple[tuple[str, float | None], ...] = (
    ('H100 PCIe', 756.0),
    ('H100 NVL', None),
    ('H200 NVL', None),
    ('GH200', 989.0),
    ('H200', 989.0),
    ('H100', 989.0),
    ('A100', 312.0),
    ('L40S', 362.0),
    ('L40', None),
    ('L4', 121.0),
    ('V100-PCIE', None),
    ('V100', 125.0),  # SXM2; float16 only
    ('TPU v4 lite', None),
    ('TPU v4', 275.0),
    ('TPU v5 lite', 197.0),
    ('TPU v5e', 197.0),
    ('TPU v5p', 459.0),
    ('TPU v5', 459.0),   # jax names v5p 'TPU v5' (v5e is 'TPU v5 lite')
    ('TPU v6 lite', 918.0),
    ('TPU v6e', 918.0),
)


def flops_per_token(num_params: int, *, num_layers: int, d_model: int,
                    seq_len: int) -> float:
  """Training FLOPs per token: ``6 * num_params + 12 * num_layers * d_model * seq_len``.

  Args:
    num_params: parameters that do matmuls (see the module doc).
    num_layers: Transformer layers ``L``.
    d_model: ``heads * head_dim``.
    seq_len: tokens per sequence ``T``.
  """
  return 6.0 * num_params + 12.0 * num_layers * d_model * seq_len


def transformer_step_bytes(*, batch: int, seq_len: int, d_model: int, num_layers: int,
                           num_heads: int, vocab: int, bytes_per_value: int = 4,
                           remat: str = 'none', microbatches: int = 1) -> int:
  """Estimated activation bytes a transformer's train step keeps for the backward pass.

  Per layer ``s * b * d * (34 + 5 * a * s / d)`` values (Korthikanti et al.
  2022, "Reducing Activation Recomputation in Large Transformer Models",
  sec. 4.1; their count is in bytes at 16 bits, here scaled by
  ``bytes_per_value / 2``), only the layer inputs ``s * b * d`` under full
  remat, plus three copies of the ``[b, s, vocab]`` float32 logits (logits,
  softmax, gradient). ``b`` is the microbatch. A lower bound of what XLA
  allocates, used to refuse hopeless sizes before compiling.
  """
  b = max(1, batch // max(1, microbatches))
  per_layer = seq_len * b * d_model * (34 + 5 * num_heads * seq_len / d_model) / 2
  if remat == 'full':
    per_layer = seq_len * b * d_model
  logits = 3 * b * seq_len * vocab * 4
  return int(num_layers * per_layer * bytes_per_value + logits)


def peak_flops(device_kind: str, dtype=jnp.bfloat16) -> float | None:
  """Peak FLOP/s of one device for ``dtype`` matmuls, or None when unknown.

  Only bfloat16 and float16 have peaks here (V100 has no bfloat16 units:
  bfloat16 there is None); float32 and CPUs are None.
  """
  dtype = jnp.dtype(dtype)
  if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return None
  for key, tflops in PEAK_BF16_TFLOPS:
    if re.search(rf'(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])', device_kind,
                 re.IGNORECASE):
      if tflops is None or (key == 'V100' and dtype == jnp.dtype(jnp.bfloat16)):
        return None
      return tflops * 1e12
  return None


def mfu(tokens_per_sec: float, flops_per_tok: float, *, device_kind: str,
        dtype=jnp.bfloat16, num_devices: int = 1) -> float | None:
  """Model FLOPs utilisation in [0, 1], or None when the peak is unknown.

  Args:
    tokens_per_sec: training tokens per second over all devices.
    flops_per_tok: from :func:`flops_per_token`.
    device_kind: ``jax.devices()[0].device_kind``.
    dtype: the compute dtype of the matmuls.
    num_devices: devices the tokens were spread over.
  """
  peak = peak_flops(device_kind, dtype)
  if peak is None or num_devices < 1:
    return None
  return tokens_per_sec * flops_per_tok / (peak * num_devices)


class ThroughputWriter:
  """Wraps a metric writer: adds ``tokens_per_sec`` (and ``mfu`` when known)
  to every record that carries ``steps_per_sec`` (the loop's log points).

  Args:
    writer: any object with ``write_scalars(step, scalars)``, ``flush()``,
      ``close()``.
    tokens_per_step: tokens in one global batch (``batch * seq``).
    flops_per_tok: from :func:`flops_per_token`.
    device_kind, dtype, num_devices: as in :func:`mfu`.
  """

  def __init__(self, writer, *, tokens_per_step: int, flops_per_tok: float,
               device_kind: str, dtype=jnp.float32, num_devices: int = 1):
    self.writer = writer
    self.tokens_per_step = tokens_per_step
    self.flops_per_tok = flops_per_tok
    self.device_kind, self.dtype, self.num_devices = device_kind, dtype, num_devices

  def write_scalars(self, step, scalars):
    if 'steps_per_sec' in scalars:
      scalars = dict(scalars)
      tokens = scalars['steps_per_sec'] * self.tokens_per_step
      scalars['tokens_per_sec'] = tokens
      value = mfu(tokens, self.flops_per_tok, device_kind=self.device_kind,
                  dtype=self.dtype, num_devices=self.num_devices)
      if value is not None:
        scalars['mfu'] = value
    self.writer.write_scalars(step, scalars)

  def flush(self):
    self.writer.flush()

  def close(self):
    self.writer.close()
