"""benchmarks.update's decode report: the rollout's decode step against the weight-read floor, from the pipeline's
token and time metrics (hand-computed)."""
from __future__ import annotations

import pytest

from benchmarks.update import decode_report
from seed_jax.models.spec import ModelSpec

SPEC = ModelSpec("LlamaForCausalLM", vocab_size=256, dim=64, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=16,
                 ffn_dim=128)


def _metrics(**kw) -> dict:
  """A rollout of 8 rows: prompts of 100 tokens, replies of 20, on 4 slots for 50 steps in 2.5 s."""
  m = {"tokens/rollout_rows_real": 8.0, "tokens/rollout_real": 8 * 120.0, "tokens/rollout_response_real": 8 * 20.0,
       "tokens/rollout_response_forwarded": 4 * 50.0, "tokens/rollout_decode_steps": 50.0,
       "time/rollout_decode_s": 2.5}
  return m | kw


@pytest.mark.parametrize("dtype,item", [("float32", 4), ("bfloat16", 2)])
def test_decode_step_against_the_weight_and_kv_read_floor(dtype, item):
  r = decode_report(SPEC, _metrics(), n_params=1_000_000, dtype=dtype, bandwidth_gbs=10.0)
  # keys + values of 2 layers x 4 kv heads x 16 dims, 4 rows at 100 + 20/2 tokens each
  kv = 2 * 2 * 4 * 16 * item * 4 * 110
  floor_ms = (1_000_000 * item + kv) / 10e9 * 1e3
  assert r["steps"] == 50 and r["rows_per_step"] == 4.0 and r["ms_per_step"] == 50.0
  assert r["floor_ms"] == pytest.approx(floor_ms, abs=0.005) and r["floor_s"] == pytest.approx(50 * floor_ms / 1e3, abs=1e-3)


def test_no_decode_steps_no_report():
  assert decode_report(SPEC, _metrics(**{"tokens/rollout_decode_steps": 0.0}), 10, "float32", 10.0) == {}
