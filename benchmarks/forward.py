"""Full forward of SmolLM2-135M (fp32 logits of every position) at batch 16 x 512: seed_jax against Hugging
Face transformers on PyTorch (CPU, fp32, 2 threads, same weights); prints one JSON line.

Each side runs in its own child process (its peak RSS is its own, loading included) on the same random
tokens; the parent measures the CPU's fp32 matmul peak in the same run and reports each side's share of it.

  python -m benchmarks.forward [--batch 16] [--seq 512] [--runs 3]
"""
from __future__ import annotations

import argparse
import tempfile

import numpy as np

from benchmarks import common


def _tokens(batch: int, seq: int, vocab: int) -> np.ndarray:
  return np.random.default_rng(0).integers(3, vocab, (batch, seq)).astype(np.int32)


def child_jax(a) -> dict:
  import jax
  import jax.numpy as jnp
  from seed_jax.models import transformer as tf
  from seed_jax.models import weights
  spec, params = weights.load_hf(a.model_dir)
  tokens = jnp.asarray(_tokens(a.batch, a.seq, spec.vocab_size))
  valid = jnp.ones(tokens.shape, bool)
  fwd = jax.jit(tf.full_logits, static_argnums=1)
  run = lambda: fwd(params, spec, tokens, valid).block_until_ready()
  compile_s = common.timed(run, 1)[0]
  times = common.timed(run, a.runs)
  return dict(times_s=times, first_call_s=compile_s, peak_rss_mb=common.peak_rss_mb())


def child_torch(a) -> dict:
  import torch
  model = common.load_torch(a.model_dir)
  tokens = torch.tensor(_tokens(a.batch, a.seq, model.config.vocab_size), dtype=torch.long)
  mask = torch.ones_like(tokens)

  def run():
    with torch.inference_mode():
      model(input_ids=tokens, attention_mask=mask).logits.float()

  common.timed(run, 1)
  times = common.timed(run, a.runs)
  return dict(times_s=times, attn=model.config._attn_implementation, peak_rss_mb=common.peak_rss_mb())


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=512)
  p.add_argument("--runs", type=int, default=3)
  p.add_argument("--child", default="")
  p.add_argument("--model_dir", default="")
  a = p.parse_args()
  if a.child:
    common.emit({"jax": child_jax, "torch": child_torch}[a.child](a))
    return
  load_start = common.load_avg()
  with tempfile.TemporaryDirectory() as d:
    spec = common.export_embedded(d)
    peak = [common.matmul_peak_gflops()]
    kw = dict(batch=a.batch, seq=a.seq, runs=a.runs)
    ours = common.run_child("benchmarks.forward", "jax", d, **kw)
    hf = common.run_child("benchmarks.forward", "torch", d, **kw)
    peak.append(common.matmul_peak_gflops())
  tokens = a.batch * a.seq
  flops = common.forward_flops_per_token(spec, a.seq) * tokens
  peak_gflops = common.median(peak)
  side = lambda r: dict(tokens_per_s=round(tokens / common.median(r["times_s"]), 1),
                        share_of_peak=round(flops / common.median(r["times_s"]) / 1e9 / peak_gflops, 3),
                        peak_rss_mb=round(r["peak_rss_mb"]), times_s=[round(t, 3) for t in r["times_s"]])
  out = dict(bench="forward", model="SmolLM2-135M", batch=a.batch, seq=a.seq, dtype="float32",
             seed_jax=dict(side(ours), compile_s=round(ours["first_call_s"] - common.median(ours["times_s"]), 2)),
             hf_torch=dict(side(hf), attn=hf["attn"], threads=common.TORCH_THREADS),
             matmul_peak_gflops=round(peak_gflops, 1), gflop_per_forward=round(flops / 1e9, 1))
  out["speed_ratio"] = round(out["seed_jax"]["tokens_per_s"] / out["hf_torch"]["tokens_per_s"], 3)
  out["rss_ratio"] = round(ours["peak_rss_mb"] / hf["peak_rss_mb"], 3)
  out["load_avg"] = dict(start=load_start, end=common.load_avg())
  common.emit(out)


if __name__ == "__main__":
  main()
