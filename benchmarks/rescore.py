"""Re-scoring 16 responses of 128 tokens under two 384-token prompt contexts with SmolLM2-135M (fp32): one
batched `rescore` pass over both contexts (C=2) against two separate passes (C=1 twice) and against Hugging
Face transformers on PyTorch (CPU, fp32, 2 threads) scoring the same 32 rows; prints one JSON line.

Tokens/s counts every row's prompt + response tokens (2 x 16 x 512 per scoring of both contexts).

  python -m benchmarks.rescore [--batch 16] [--prompt 384] [--response 128] [--runs 3]
"""
from __future__ import annotations

import argparse
import tempfile

import numpy as np

from benchmarks import common


def _rows(a, vocab: int):
  rng = np.random.default_rng(0)
  prompts_CBP = rng.integers(3, vocab, (2, a.batch, a.prompt)).astype(np.int32)
  resp_BR = rng.integers(3, vocab, (a.batch, a.response)).astype(np.int32)
  return prompts_CBP, resp_BR


def child_jax(a) -> dict:
  import jax
  import jax.numpy as jnp
  from seed_jax.models import weights
  from seed_jax.rescore import rescore
  spec, params = weights.load_hf(a.model_dir)
  prompts_CBP, resp_BR = _rows(a, spec.vocab_size)
  prompt, resp = jnp.asarray(prompts_CBP), jnp.asarray(resp_BR)
  pvalid, rmask = jnp.ones(prompt.shape, bool), jnp.ones(resp.shape, bool)
  static = dict(spec=spec, dtype=jnp.float32, chunk=min(128, a.response), with_entropy=False)
  temp = jnp.float32(1.0)

  def one_pass():
    return jax.block_until_ready(rescore(params, prompt, pvalid, resp, rmask, temp, **static))[0]

  def two_passes():
    return jnp.concatenate([jax.block_until_ready(rescore(params, prompt[c:c + 1], pvalid[c:c + 1], resp, rmask, temp,
                                                          **static))[0] for c in range(2)])

  first = dict(one=common.timed(one_pass, 1)[0], two=common.timed(two_passes, 1)[0])
  times = dict(one=[], two=[])
  for _ in range(a.runs):  # interleaved, so drifting load hits both alike
    times["one"] += common.timed(one_pass, 1)
    times["two"] += common.timed(two_passes, 1)
  diff = float(jnp.abs(one_pass() - two_passes()).max())
  return dict(times_s=times, first_call_s=first, max_abs_diff=diff, peak_rss_mb=common.peak_rss_mb(),
              logp_sum=float(one_pass().sum()))


def child_torch(a) -> dict:
  import torch
  model = common.load_torch(a.model_dir)
  prompts_CBP, resp_BR = _rows(a, model.config.vocab_size)
  rows = np.concatenate([np.concatenate([prompts_CBP[c], resp_BR], axis=1) for c in range(2)])
  tokens = torch.tensor(rows, dtype=torch.long)
  resp = torch.tensor(np.concatenate([resp_BR, resp_BR]), dtype=torch.long)
  out = []

  def run():  # only the positions that predict response tokens go through the vocabulary projection
    with torch.inference_mode():
      logits = model(input_ids=tokens, attention_mask=torch.ones_like(tokens), logits_to_keep=a.response + 1).logits
      logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
      out.append(torch.gather(logp, -1, resp[..., None])[..., 0])

  common.timed(run, 1)
  times = common.timed(run, a.runs)
  return dict(times_s=times, peak_rss_mb=common.peak_rss_mb(), logp_sum=float(out[-1].sum()))


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--prompt", type=int, default=384)
  p.add_argument("--response", type=int, default=128)
  p.add_argument("--runs", type=int, default=3)
  p.add_argument("--child", default="")
  p.add_argument("--model_dir", default="")
  a = p.parse_args()
  if a.child:
    common.emit({"jax": child_jax, "torch": child_torch}[a.child](a))
    return
  load_start = common.load_avg()
  kw = dict(batch=a.batch, prompt=a.prompt, response=a.response, runs=a.runs)
  with tempfile.TemporaryDirectory() as d:
    common.export_embedded(d)
    ours = common.run_child("benchmarks.rescore", "jax", d, **kw)
    hf = common.run_child("benchmarks.rescore", "torch", d, **kw)
  tokens = 2 * a.batch * (a.prompt + a.response)
  tps = lambda ts: round(tokens / common.median(ts), 1)
  out = dict(bench="rescore", model="SmolLM2-135M", contexts=2, batch=a.batch, prompt=a.prompt, response=a.response,
             dtype="float32",
             seed_one_pass=dict(tokens_per_s=tps(ours["times_s"]["one"]),
                                times_s=[round(t, 3) for t in ours["times_s"]["one"]]),
             seed_two_passes=dict(tokens_per_s=tps(ours["times_s"]["two"]),
                                  times_s=[round(t, 3) for t in ours["times_s"]["two"]]),
             hf_torch=dict(tokens_per_s=tps(hf["times_s"]), times_s=[round(t, 3) for t in hf["times_s"]],
                           peak_rss_mb=round(hf["peak_rss_mb"])),
             seed_peak_rss_mb=round(ours["peak_rss_mb"]), one_vs_two_max_abs_diff=ours["max_abs_diff"],
             logp_sum_diff_vs_hf=round(abs(ours["logp_sum"] - hf["logp_sum"]), 4))
  out["ratio_one_vs_two_passes"] = round(out["seed_one_pass"]["tokens_per_s"] / out["seed_two_passes"]["tokens_per_s"], 3)
  out["ratio_one_pass_vs_hf"] = round(out["seed_one_pass"]["tokens_per_s"] / out["hf_torch"]["tokens_per_s"], 3)
  out["load_avg"] = dict(start=load_start, end=common.load_avg())
  common.emit(out)


if __name__ == "__main__":
  main()
