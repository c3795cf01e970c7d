"""An accelerator session's figures in one command: random-weight Qwen2.5-shaped models in bf16 on the first
device, each part printing one JSON line (and the last line all of them):

- `mfu`: forward (hidden states + the chunked log-prob of every next token, as the re-score computes them) and
  one train step (the same loss, its gradient with rematerialized layers, AdamW on fp32 master weights) of the
  1.5B and the 3B shape at 8 x 2048 tokens; model FLOP/s over the chip's nominal bf16 peak (PEAKS) and over a
  bf16 matmul measured here.
- `decode`: the Sampler's greedy decode (bf16, batch 8 and 32, prompt 512, 128 new tokens) of the 1.5B shape,
  ms per step against the roofline: (bf16 weights + the KV cache read per step) / the HBM bandwidth measured
  here with a large copy.
- `attention`: cuDNN's fused attention (jax.nn.dot_product_attention) against the blockwise path, the largest
  difference of the outputs and the fwd / fwd+bwd times at 4 x 4096 tokens, 16 query and 2 kv heads of 128.
- `update`: one SEED update of the Sokoban text env (benchmarks.update, per phase) with a 0.5B-shaped random
  model (the embedded tokenizer's vocabulary) and the bf16 sampler.

  bash benchmarks/accelerator.sh                   # the device machine (about 8 minutes on one H100/H200)
  python -m benchmarks.accelerator --tiny          # the same code on a CPU with tiny shapes (a smoke test)
  python -m benchmarks.accelerator --parts=mfu,decode
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks import common

# Qwen2.5 shapes (hidden, layers, query heads, kv heads, ffn); every one ties its embeddings.
SHAPES = {"0.5b": (896, 24, 14, 2, 4864), "1.5b": (1536, 28, 12, 2, 8960), "3b": (2048, 36, 16, 2, 11008),
          "tiny": (64, 2, 4, 2, 128)}
QWEN_VOCAB = 151936
# Nominal dense bf16 FLOP/s and HBM bytes/s by device_kind substring (first match).
PEAKS = (("H200", 989e12, 4.8e12), ("H100", 989e12, 3.35e12), ("A100", 312e12, 2.0e12), ("L4", 121e12, 0.3e12),
         ("TPU v6", 918e12, 1.64e12), ("TPU v5p", 459e12, 2.765e12), ("TPU v5", 197e12, 0.819e12),
         ("TPU v4", 275e12, 1.2e12))


def hf_config(shape: str, vocab: int) -> dict[str, Any]:
  D, L, H, K, F = SHAPES[shape]
  return dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=vocab, hidden_size=D,
              num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=K, intermediate_size=F,
              max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
              hidden_act="silu", torch_dtype="bfloat16")


def model(shape: str, vocab: int = QWEN_VOCAB, dtype=None):
  """(spec, params) of a random model of `shape`, params cast to `dtype` (None: fp32)."""
  import jax
  from seed_jax.models import spec as spec_lib
  from seed_jax.models import transformer as tf
  spec = spec_lib.ModelSpec.from_hf_config(hf_config(shape, vocab))
  params = tf.init_params(spec, 0)
  return spec, (params if dtype is None else jax.tree.map(lambda x: x.astype(dtype), params))


def device_facts() -> dict[str, Any]:
  import jax
  d = jax.devices()[0]
  kind = getattr(d, "device_kind", str(d))
  peak, bw = next(((p, b) for name, p, b in PEAKS if name in kind), (None, None))
  return dict(platform=d.platform, device_kind=kind, nominal_bf16_flops=peak, nominal_hbm_bytes_s=bw,
              jax=jax.__version__, cpu=common.cpu_model())


def _time(fn, runs: int) -> dict[str, float]:
  first = common.timed(fn, 1)[0]
  ts = common.timed(fn, runs)
  return dict(first_s=round(first, 3), median_s=common.median(ts), runs_s=[round(t, 5) for t in ts])


def measured_matmul_flops(n: int) -> float:
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
  mm = jax.jit(lambda x: x @ x)
  return 2 * n ** 3 / _time(lambda: mm(a).block_until_ready(), 5)["median_s"]


def measured_bandwidth(n_bytes: int) -> float:
  """Bytes/s of a large elementwise copy (each byte read once and written once)."""
  import jax
  import jax.numpy as jnp
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  f = jax.jit(lambda v: v * 1.0001)
  return 2 * n_bytes / _time(lambda: f(x).block_until_ready(), 5)["median_s"]


def _loss_fn(spec, chunk: int):
  import jax.numpy as jnp
  from seed_jax.models import logprobs
  from seed_jax.models import transformer as tf

  def loss(params, tokens_BT):
    seg_BT = jnp.ones_like(tokens_BT)
    pos_BT = jnp.broadcast_to(jnp.arange(tokens_BT.shape[1]), tokens_BT.shape)
    hidden_BTD, _ = tf.forward(params, spec, tokens_BT, pos_BT, seg_BT, None, jnp.bfloat16, remat=True)
    lp_BT, _ = logprobs.token_logprobs(params, spec, hidden_BTD[:, :-1], tokens_BT[:, 1:], seg_BT[:, 1:] > 0, 1.0,
                                       dtype=jnp.bfloat16, chunk=chunk, remat=True, with_entropy=False)
    return -lp_BT.mean()
  return loss


def part_mfu(a, facts) -> dict[str, Any]:
  import jax
  import jax.numpy as jnp
  import optax
  B, T = (2, 128) if a.tiny else (8, 2048)
  peak_measured = measured_matmul_flops(512 if a.tiny else 8192)
  out = dict(part="mfu", batch=B, seq=T, measured_bf16_matmul_flops=peak_measured, shapes={})
  for shape in (["tiny"] if a.tiny else ["1.5b", "3b"]):
    spec, params = model(shape, 512 if a.tiny else QWEN_VOCAB)  # fp32 master weights
    tokens = jax.random.randint(jax.random.key(1), (B, T), 3, spec.vocab_size, jnp.int32)
    loss = _loss_fn(spec, chunk=min(512, T))
    flops_fwd = common.forward_flops_per_token(spec, T) * B * T
    fwd = jax.jit(loss)
    f = _time(lambda: fwd(params, tokens).block_until_ready(), a.runs)
    opt = optax.adamw(1e-5)
    state = opt.init(params)

    @jax.jit
    def step(p, s, t):
      l, g = jax.value_and_grad(loss)(p, t)
      u, s = opt.update(g, s, p)
      return optax.apply_updates(p, u), s, l

    holder = [params, state]

    def run():
      holder[0], holder[1], l = step(holder[0], holder[1], tokens)
      l.block_until_ready()
    s = _time(run, a.runs)
    mfu = lambda flops, t, peak: round(flops / t / peak, 4) if peak else None
    out["shapes"][shape] = dict(
        params=int(sum(x.size for x in jax.tree.leaves(params))), forward=f, train_step=s,
        forward_mfu=mfu(flops_fwd, f["median_s"], facts["nominal_bf16_flops"]),
        train_mfu=mfu(3 * flops_fwd, s["median_s"], facts["nominal_bf16_flops"]),  # remat's extra forward not counted
        forward_over_measured_matmul=mfu(flops_fwd, f["median_s"], peak_measured),
        train_over_measured_matmul=mfu(3 * flops_fwd, s["median_s"], peak_measured))
    del params, state, holder
  return out


def part_decode(a, facts) -> dict[str, Any]:
  import jax
  import jax.numpy as jnp
  from seed_jax.sample import Sampler, SamplerConfig, SamplingParams
  shape, P, N = ("tiny", 32, 16) if a.tiny else ("1.5b", 512, 128)
  spec, params = model(shape, 512 if a.tiny else QWEN_VOCAB)
  bw = measured_bandwidth((64 if a.tiny else 4096) * 2 ** 20)
  weight_bytes = sum(x.size for x in jax.tree.leaves(params)) * 2  # the sampler reads bf16 weights
  out = dict(part="decode", shape=shape, prompt=P, new_tokens=N, measured_bytes_s=bw, batches={})
  for B in (8, 32):
    prompts = np.random.default_rng(0).integers(3, spec.vocab_size, (B, P)).tolist()
    sampler = Sampler(spec, [], SamplerConfig(max_prompt_len=P, min_prompt_bucket=P, min_batch=B, max_batch=B,
                                              dtype="bfloat16"))
    go = lambda n: sampler.generate(params, prompts, jax.random.key(0), SamplingParams(temperature=0.0, max_new_tokens=n))
    one = _time(lambda: go(1), a.runs)  # prefill + one step
    full = _time(lambda: go(N), a.runs)
    ms_step = (full["median_s"] - one["median_s"]) / (N - 1) * 1e3
    kv_bytes = spec.n_layers * 2 * spec.n_kv_heads * spec.head_dim * 2 * B * (P + N / 2)  # bf16 K and V read
    floor_ms = (weight_bytes + kv_bytes) / bw * 1e3
    nominal = facts["nominal_hbm_bytes_s"]
    out["batches"][B] = dict(ms_per_step=round(ms_step, 3), floor_ms_measured_bw=round(floor_ms, 3),
                             step_over_floor=round(ms_step / floor_ms, 3),
                             roofline_fraction_nominal=round((weight_bytes + kv_bytes) / nominal * 1e3 / ms_step, 4)
                             if nominal else None, prefill_plus_one_s=one["median_s"], call_s=full["median_s"])
  return out


def part_attention(a, facts) -> dict[str, Any]:
  import jax
  import jax.numpy as jnp
  from seed_jax.models import attention
  B, T, K, G, h = (2, 256, 2, 2, 32) if a.tiny else (4, 4096, 2, 8, 128)
  ks = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(ks[0], (B, T, K, G, h), jnp.bfloat16)
  k, v = (jax.random.normal(kk, (B, T, K, h), jnp.bfloat16) for kk in ks[1:3])
  seg = jnp.ones((B, T), jnp.int32).at[0, : T // 4].set(0)  # one row left-padded by a quarter
  fused_impl = "cudnn" if facts["platform"] == "gpu" else "xla"
  paths = {"blockwise": lambda q, k, v: attention.blockwise_causal_attention(q, k, v, seg, block=512, dtype=jnp.bfloat16),
           fused_impl: lambda q, k, v: attention.fused_causal_attention(q, k, v, seg, implementation=fused_impl)}
  out = dict(part="attention", shape=dict(B=B, T=T, kv_heads=K, groups=G, head_dim=h), paths={})
  results = {}
  for name, f in paths.items():
    fwd = jax.jit(f)
    grad = jax.jit(jax.grad(lambda q, k, v: f(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2)))
    results[name] = np.asarray(fwd(q, k, v), np.float32)
    out["paths"][name] = dict(forward=_time(lambda: fwd(q, k, v).block_until_ready(), a.runs),
                              forward_backward=_time(lambda: jax.block_until_ready(grad(q, k, v)), a.runs))
  a_, b_ = results.values()
  out["max_abs_diff"] = float(np.abs(a_ - b_).max())
  out["fused_over_blockwise_forward"] = round(out["paths"][fused_impl]["forward"]["median_s"] /
                                              out["paths"]["blockwise"]["forward"]["median_s"], 4)
  return out


def part_update(a, facts) -> dict[str, Any]:
  """benchmarks.update on the Sokoban text env with a random 0.5B-shaped model (as an HF folder)."""
  from seed_jax.models import load, weights
  vocab = load.load_tokenizer("embedded").vocab_size
  with tempfile.TemporaryDirectory() as tmp:
    spec, params = model("tiny" if a.tiny else "0.5b", vocab)
    weights.export_hf(params, spec, tmp)
    sets = [f"model.path={tmp}", "model.tokenizer=embedded", "sampler.dtype=bfloat16"]
    if a.tiny:
      sets += ["rollout.tasks_per_update=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
               "analyzer.max_new_tokens=16", "env.max_steps=2", "learner.minibatch_size=8", "learner.micro_batch_size=4"]
    args = [sys.executable, "-m", "benchmarks.update", "--config", "sokoban"] + [x for s in sets for x in ("--set", s)]
    proc = subprocess.run(args, cwd=common.ROOT, stdout=subprocess.PIPE, text=True, timeout=a.update_timeout_s)
    if proc.returncode:
      return dict(part="update", error=f"benchmarks.update exited {proc.returncode}")
    return dict(part="update", shape="tiny" if a.tiny else "0.5b", **json.loads(proc.stdout.strip().splitlines()[-1]))


PARTS = {"mfu": part_mfu, "decode": part_decode, "attention": part_attention, "update": part_update}


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated: {', '.join(PARTS)}")
  p.add_argument("--tiny", action="store_true", help="tiny shapes: the code path on a CPU in a minute")
  p.add_argument("--runs", type=int, default=3)
  p.add_argument("--update_timeout_s", type=int, default=300)
  a = p.parse_args()
  facts = device_facts()
  results = dict(bench="accelerator", date=time.strftime("%Y-%m-%d"), tiny=a.tiny, **facts)
  for name in a.parts.split(","):
    t0 = time.time()
    try:
      r = PARTS[name](a, facts)
    except Exception as e:  # one part failing leaves the others' figures
      r = dict(part=name, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    r["wall_s"] = round(time.time() - t0, 1)
    common.emit(dict(r, cpu=facts["cpu"], device_kind=facts["device_kind"]))
    results[name] = r
  common.emit(results)


if __name__ == "__main__":
  main()
