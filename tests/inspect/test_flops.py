"""FLOPs per token, the peak table, MFU, and the throughput writer."""

import jax.numpy as jnp
import pytest

from purax.inspect import flops


def test_flops_per_token_is_6n_plus_the_attention_term():
  # GPT-2 small as in nanoGPT's estimate_mfu: 6N + 12 * L * d * T.
  n, layers, d, seq = 123_653_376, 12, 768, 1024
  assert flops.flops_per_token(n, num_layers=layers, d_model=d, seq_len=seq) == \
      6 * n + 12 * layers * d * seq


@pytest.mark.parametrize('kind, tflops', [
    ('NVIDIA H200', 989), ('NVIDIA H100 80GB HBM3', 989), ('NVIDIA H100 PCIe', 756),
    ('NVIDIA A100-SXM4-80GB', 312), ('NVIDIA A100-PCIE-40GB', 312), ('NVIDIA L4', 121),
    ('TPU v4', 275), ('TPU v5 lite', 197), ('TPU v5', 459),
    ('cpu', None), ('NVIDIA H100 NVL', None), ('NVIDIA L40', None), ('Some New GPU', None),
    ('NVIDIA H200 NVL', None), ('TPU v4 lite', None), ('Tesla V100-PCIE-16GB', None),
])
def test_peak_table_knows_its_devices_and_nothing_else(kind, tflops):
  expected = None if tflops is None else tflops * 1e12
  assert flops.peak_flops(kind, jnp.bfloat16) == expected


def test_no_peak_for_float32_or_bfloat16_on_v100():
  assert flops.peak_flops('NVIDIA H200', jnp.float32) is None
  assert flops.peak_flops('Tesla V100-SXM2-16GB', jnp.bfloat16) is None
  assert flops.peak_flops('Tesla V100-SXM2-16GB', jnp.float16) == 125e12


def test_mfu_is_achieved_over_peak_flops_and_none_when_unknown():
  assert flops.mfu(1e5, 1e9, device_kind='NVIDIA H200', num_devices=2) == \
      pytest.approx(1e14 / (2 * 989e12))
  assert flops.mfu(1e5, 1e9, device_kind='cpu') is None


class Recorder:
  def __init__(self):
    self.records, self.closed = [], False

  def write_scalars(self, step, scalars):
    self.records.append((step, dict(scalars)))

  def flush(self):
    pass

  def close(self):
    self.closed = True


def test_throughput_writer_adds_tokens_per_sec_and_mfu_only_when_known():
  inner = Recorder()
  writer = flops.ThroughputWriter(inner, tokens_per_step=1000, flops_per_tok=1e9,
                                  device_kind='NVIDIA H100 80GB HBM3', dtype=jnp.bfloat16)
  writer.write_scalars(10, {'steps_per_sec': 2.0, 'train/loss': 1.0})
  writer.write_scalars(10, {'eval/loss': 1.0})
  (_, first), (_, second) = inner.records
  assert first['tokens_per_sec'] == 2000.0
  assert first['mfu'] == pytest.approx(2e12 / 989e12)
  assert second == {'eval/loss': 1.0}
  cpu = Recorder()
  flops.ThroughputWriter(cpu, tokens_per_step=10, flops_per_tok=1.0, device_kind='cpu'
                         ).write_scalars(1, {'steps_per_sec': 1.0})
  assert cpu.records == [(1, {'steps_per_sec': 1.0, 'tokens_per_sec': 10.0})]
  writer.close()
  assert inner.closed
