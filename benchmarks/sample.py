"""Greedy generation with SmolLM2-135M, batch 8 x prompt 256 -> 128 new tokens, no early stop: the seed_jax
Sampler (fp32 and bf16) against Hugging Face `generate` (PyTorch CPU, fp32, 2 threads, same weights);
prints one JSON line. Tokens/s counts generated tokens over the whole call (prefill included).

`decode` (seed_jax sides): ms per decode step, from the difference between the full call and one of new/8
tokens (the prefill cancels), against the step's memory floor: the weights in the sampler's dtype plus the KV
cache positions a step attends (prompt + new/2 on average, every row), over the read bandwidth measured in the
same child (common.stream_bandwidth_gbs). `decode.over_floor` is their ratio. `decode.projections_ms` is a
step's weight products alone (every layer's q/k/v, output, gate/up and down projections and the vocabulary
projection, chained at the same batch, as one jitted loop): what XLA:CPU's dot kernels take for the weight
reads at these sizes, before any attention, norm or sampling (`projections_over_floor`).

Each configuration runs in its own child process, so each peak RSS is its own (loading included).

  python -m benchmarks.sample [--batch 8] [--prompt 256] [--new 128] [--runs 3]
"""
from __future__ import annotations

import argparse
import tempfile

import numpy as np

from benchmarks import common


def _prompts(batch: int, prompt: int, vocab: int) -> np.ndarray:
  return np.random.default_rng(0).integers(3, vocab, (batch, prompt)).astype(np.int32)


def child_jax(a, dtype: str) -> dict:
  import jax
  from seed_jax.models import weights
  from seed_jax.sample import Sampler, SamplerConfig, SamplingParams
  spec, params = weights.load_hf(a.model_dir)
  prompts = _prompts(a.batch, a.prompt, spec.vocab_size).tolist()
  sampler = Sampler(spec, [], SamplerConfig(max_prompt_len=a.prompt, min_prompt_bucket=a.prompt, min_batch=a.batch,
                                            max_batch=a.batch, dtype=dtype))
  sp = SamplingParams(temperature=0.0, max_new_tokens=a.new)
  out = []
  run = lambda: out.append(sampler.generate(params, prompts, jax.random.key(0), sp))
  first_s = common.timed(run, 1)[0]
  times = common.timed(run, a.runs)
  if any(len(g.tokens) != a.new for g in out[-1]):
    raise RuntimeError("a row stopped early")
  tokens = [list(map(int, g.tokens)) for g in out[-1]]
  short = SamplingParams(temperature=0.0, max_new_tokens=max(a.new // 8, 1))
  short_run = lambda: sampler.generate(params, prompts, jax.random.key(0), short)
  common.timed(short_run, 1)  # compiles the shorter decode loop
  steps = a.new - short.max_new_tokens
  step_ms = (common.median(times) - common.median(common.timed(short_run, a.runs))) / steps * 1e3
  return dict(times_s=times, first_call_s=first_s, peak_rss_mb=common.peak_rss_mb(), tokens=tokens,
              decode=decode_floor(spec, params, a, dtype, step_ms))


def decode_floor(spec, params, a, dtype: str, step_ms: float) -> dict:
  """The decode step against the time to read what it must read once (see the module docstring)."""
  import jax
  bandwidth = common.stream_bandwidth_gbs()
  floor_ms, weights, kv = common.decode_read_floor(spec, sum(x.size for x in jax.tree.leaves(params)), dtype,
                                                   a.batch, a.prompt + a.new / 2, bandwidth)
  proj_ms = projections_ms(spec, dtype, a.batch)
  return dict(ms_per_step=round(step_ms, 2), floor_ms=round(floor_ms, 2), over_floor=round(step_ms / floor_ms, 2),
              projections_ms=round(proj_ms, 2), projections_over_floor=round(proj_ms / floor_ms, 2),
              bandwidth_gbs=round(bandwidth, 1), weight_mb=round(weights / 2 ** 20), kv_mb=round(kv / 2 ** 20))


def projections_ms(spec, dtype: str, batch: int, steps: int = 16) -> float:
  """ms per step of a decode step's weight products alone (see the module docstring), median of 5 loops."""
  import jax
  import jax.numpy as jnp
  dt, D, h = jnp.dtype(dtype), spec.dim, spec.head_dim
  shapes = [(D, (spec.n_heads + 2 * spec.n_kv_heads) * h), (spec.n_heads * h, D), (D, 2 * spec.ffn_dim),
            (spec.ffn_dim, D)]
  key = jax.random.key(0)
  layers = [[(jax.random.normal(jax.random.fold_in(key, 4 * i + j), s) * 0.02).astype(dt)
             for j, s in enumerate(shapes)] for i in range(spec.n_layers)]
  vocab = (jax.random.normal(key, (D, spec.vocab_size)) * 0.02).astype(dt)
  dot = lambda x, w: jnp.einsum("bd,df->bf", x.astype(dt), w, preferred_element_type=jnp.float32)

  def loop(layers, vocab, x_BD):
    def step(_, x_BD):
      for w_qkv, w_o, w_gu, w_down in layers:
        x_BD = x_BD + dot(dot(x_BD, w_qkv)[:, :spec.n_heads * h], w_o)
        gu = dot(x_BD, w_gu)
        x_BD = x_BD + dot(jax.nn.silu(gu[:, :spec.ffn_dim]) * gu[:, spec.ffn_dim:], w_down)
      return x_BD + 1e-3 * dot(x_BD, vocab)[:, :D]
    return jax.lax.fori_loop(0, steps, step, x_BD)

  run = jax.jit(loop)
  x = jnp.ones((batch, D), jnp.float32)
  run(layers, vocab, x).block_until_ready()
  return common.median(common.timed(lambda: run(layers, vocab, x).block_until_ready(), 5)) / steps * 1e3


def child_torch(a) -> dict:
  import torch
  model = common.load_torch(a.model_dir)
  prompts = torch.tensor(_prompts(a.batch, a.prompt, model.config.vocab_size), dtype=torch.long)
  mask = torch.ones_like(prompts)
  out = []

  def run():
    with torch.inference_mode():
      out.append(model.generate(input_ids=prompts, attention_mask=mask, do_sample=False, max_new_tokens=a.new,
                                min_new_tokens=a.new, pad_token_id=0))

  common.timed(run, 1)
  times = common.timed(run, a.runs)
  new = out[-1][:, a.prompt:]
  if new.shape[1] != a.new:
    raise RuntimeError(f"HF generated {new.shape[1]} tokens, not {a.new}")
  return dict(times_s=times, peak_rss_mb=common.peak_rss_mb(), tokens=new.tolist())


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--prompt", type=int, default=256)
  p.add_argument("--new", type=int, default=128)
  p.add_argument("--runs", type=int, default=3)
  p.add_argument("--child", default="")
  p.add_argument("--model_dir", default="")
  a = p.parse_args()
  if a.child:
    fns = {"jax_fp32": lambda: child_jax(a, "float32"), "jax_bf16": lambda: child_jax(a, "bfloat16"),
           "torch": lambda: child_torch(a)}
    common.emit(fns[a.child]())
    return
  load_start = common.load_avg()
  kw = dict(batch=a.batch, prompt=a.prompt, new=a.new, runs=a.runs)
  with tempfile.TemporaryDirectory() as d:
    common.export_embedded(d)
    res = {name: common.run_child("benchmarks.sample", name, d, **kw) for name in ("jax_fp32", "torch", "jax_bf16")}
  generated = a.batch * a.new
  side = lambda r: dict(tokens_per_s=round(generated / common.median(r["times_s"]), 1),
                        peak_rss_mb=round(r["peak_rss_mb"]), times_s=[round(t, 2) for t in r["times_s"]])
  out = dict(bench="sample", model="SmolLM2-135M", batch=a.batch, prompt=a.prompt, new_tokens=a.new, greedy=True)
  for name in ("jax_fp32", "jax_bf16"):
    r = res[name]
    out[f"seed_{name[4:]}"] = dict(side(r), compile_s=round(r["first_call_s"] - common.median(r["times_s"]), 2),
                                   decode=r["decode"])
    out[f"decode_over_floor_{name[4:]}"] = r["decode"]["over_floor"]
  out["hf_generate_fp32"] = side(res["torch"])
  hf = out["hf_generate_fp32"]["tokens_per_s"]
  out["ratio_fp32"] = round(out["seed_fp32"]["tokens_per_s"] / hf, 3)
  out["ratio_bf16"] = round(out["seed_bf16"]["tokens_per_s"] / hf, 3)
  # Greedy rows equal to HF's token for token (fp32 rounding may flip a near-tie late in a row).
  for name in ("jax_fp32", "jax_bf16"):
    rows = list(zip(res[name]["tokens"], res["torch"]["tokens"]))
    out[f"{name[4:]}_rows_equal_hf"] = sum(a == b for a, b in rows)
    out[f"{name[4:]}_first_divergence"] = min((next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
                                               for a, b in rows), default=0)
  out["load_avg"] = dict(start=load_start, end=common.load_avg())
  common.emit(out)


if __name__ == "__main__":
  main()
