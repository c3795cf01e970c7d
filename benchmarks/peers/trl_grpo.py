"""seed_jax's whole GRPO update (and the SEED arm's) against TRL's own `GRPOTrainer` on the same work, one
after the other on this machine; prints one JSON line with per-phase seconds and TRL's time over seed_jax's.

seed_jax's side is `benchmarks.update` (its own child per arm: the embedded ScienceWorld default, SmolLM2-135M
fp32, a warm-up update, then the measured one). TRL's side then runs in a Python that has TRL (its own venv;
this file needs nothing of seed_jax there): the same weights and tokenizer (exported to an HF folder), as many
rows as the GRPO arm's step-samples (rounded to a multiple of the group size; each prompt sampled group-size
times), prompts of the GRPO arm's average prompt length, completions forced to its average response length
(min_new_tokens = max_completion_length), KL to the reference (beta = learner's kl_coef), AdamW at the
learner's settings, gradient checkpointing (learner.remat), 2 threads; one optimizer step per update
as the learner's. TRL's phases: `generation` (its `_generate`), `reference` (the reference model's log-probs),
`training` (the rest of the step: forward, backward, optimizer, reward bookkeeping); medians of the updates
after the first (which warms caches up).

`ratio.ceiling_whole_update` bounds what any implementation could show on this work here: TRL's whole update over
the GRPO arm's FLOP-ideal time (every phase's real tokens at the matmul peak of its dtype, measured in seed_jax's
run; decode counted by its FLOPs, not its weight reads, and no recomputed forward: a bound from below on the time,
so from above on the ratio). `ideal_over_actual`: that ideal time over each side's whole update.

`--dtype=bfloat16` compares mixed precision on CPUs with native bf16 (AVX512_BF16 / AMX): seed_jax's
`sampler.dtype`, `rescore.dtype` and `learner.dtype` at bfloat16 (fp32 master weights and loss), TRL's `bf16=True`
(the Trainer's CPU autocast: fp32 weights, bf16 matmuls). The default is fp32 on both sides.

Install TRL once, in its own venv (its pins differ from the project's):
  python -m venv /tmp/trl && /tmp/trl/bin/pip install trl==1.16.0 torch==2.13.0 transformers==5.24.0
  python -m benchmarks.peers.trl_grpo --trl_python /tmp/trl/bin/python [--updates 3] [--arms grpo,seed] \
      [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PROMPT_TEXT = ("You are in the kitchen. In it, you see: a counter, a fridge, a sink, a stove, a cupboard, a table, "
               "an oven, a glass jar containing water, a thermometer, a lighter, a metal pot and a window. ")


def _child(a) -> dict:
  """TRL's side (run by the Python that has TRL)."""
  import numpy as np
  import torch
  from datasets import Dataset
  from transformers import AutoTokenizer, TrainerCallback
  from trl import GRPOConfig, GRPOTrainer

  torch.set_num_threads(a.threads)
  tok = AutoTokenizer.from_pretrained(a.model_dir)
  tok.pad_token = tok.pad_token or tok.eos_token
  ids = tok(PROMPT_TEXT * (a.prompt_tokens // 20 + 2), add_special_tokens=False)["input_ids"]
  # Distinct prompts of prompt_tokens tokens each (a rotation of the same text, so no two share a cache).
  prompts = [tok.decode(ids[i:i + a.prompt_tokens]) for i in range(a.rows // a.group)]
  times: dict[str, list[float]] = {"generation": [], "reference": [], "update": []}
  shapes: dict[str, list[int]] = {}
  acc = {"generation": 0.0, "reference": 0.0}

  class Timed(GRPOTrainer):
    def _generate(self, *args, **kw):
      t0 = time.perf_counter()
      out = super()._generate(*args, **kw)
      acc["generation"] += time.perf_counter() - t0
      return out

    def _get_per_token_logps_and_entropies(self, model, *args, **kw):
      t0 = time.perf_counter()
      out = super()._get_per_token_logps_and_entropies(model, *args, **kw)
      if model is self.ref_model:
        acc["reference"] += time.perf_counter() - t0
      return out

    def _generate_and_score_completions(self, *args, **kw):
      out = super()._generate_and_score_completions(*args, **kw)
      shapes.update(prompt=list(out["prompt_ids"].shape), completion=list(out["completion_ids"].shape))
      return out

  class Steps(TrainerCallback):
    def on_step_begin(self, *_, **__):
      acc.update(generation=0.0, reference=0.0, t0=time.perf_counter())

    def on_step_end(self, *_, **__):
      times["update"].append(time.perf_counter() - acc["t0"])
      times["generation"].append(acc["generation"])
      times["reference"].append(acc["reference"])

  rng = np.random.default_rng(0)
  reward = lambda completions, **_: rng.random(len(completions)).tolist()  # rewards vary: advantages do
  cfg = GRPOConfig(
      output_dir=a.out_dir, per_device_train_batch_size=a.rows, gradient_accumulation_steps=1,
      num_generations=a.group, max_completion_length=a.completion_tokens,
      generation_kwargs={"min_new_tokens": a.completion_tokens}, temperature=1.0, top_p=1.0, top_k=0,
      beta=a.beta, learning_rate=a.lr, weight_decay=a.weight_decay, adam_beta1=0.9, adam_beta2=0.999,
      adam_epsilon=1e-8, max_grad_norm=1.0, lr_scheduler_type="constant", gradient_checkpointing=a.remat,
      max_steps=a.updates, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
      bf16=a.dtype == "bfloat16", seed=0, num_iterations=1, shuffle_dataset=False, dataloader_num_workers=0,
      disable_tqdm=True)
  trainer = Timed(model=a.model_dir, reward_funcs=reward, args=cfg, processing_class=tok, callbacks=[Steps()],
                  train_dataset=Dataset.from_dict({"prompt": prompts * a.updates * 2}))
  trainer.train()
  med = {k: statistics.median(v[1:] or v) for k, v in times.items()}
  med["training"] = med["update"] - med["generation"] - med["reference"]
  import trl
  return dict(side="trl", trl=trl.__version__, torch=torch.__version__, threads=a.threads, bf16=cfg.bf16,
              shapes=shapes,
              seconds={k: round(v, 3) for k, v in med.items()},
              per_update={k: [round(x, 3) for x in v] for k, v in times.items()})


def _ours(arm: str, sets: list[str]) -> dict:
  from benchmarks import common
  args = [sys.executable, "-m", "benchmarks.update", "--child"]
  for pair in (["analyzer.enabled=false"] if arm == "grpo" else []) + sets:
    args += ["--set", pair]
  env = dict(os.environ, JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
  proc = subprocess.run(args, cwd=common.ROOT, env=env, stdout=subprocess.PIPE, text=True)
  if proc.returncode:
    raise SystemExit(f"benchmarks.update ({arm} arm) failed ({proc.returncode})")
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  ph = out["phases"]
  split = ph["rollout"]["split"]
  out["ideal_s"] = round(sum(p["ideal_s"] for p in ph.values()), 3)
  out["seconds"] = dict(generation=round(split["prefill_s"] + split["decode_s"], 3), env=split["env_s"],
                        rollout=ph["rollout"]["wall_s"], analysis=ph["analysis"]["wall_s"],
                        reference=ph["rescore"]["wall_s"], training=ph["update"]["wall_s"],
                        update=out["measured_update_s"])
  return out


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--trl_python", default=sys.executable, help="a Python with trl, torch and transformers")
  p.add_argument("--updates", type=int, default=3, help="TRL updates (the first is a warm-up)")
  p.add_argument("--arms", default="grpo,seed")
  p.add_argument("--set", action="append", default=[], help="config override for seed_jax's side, key=value")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="matmuls on both sides")
  p.add_argument("--child", action="store_true")
  for k, t in (("model_dir", str), ("out_dir", str), ("rows", int), ("group", int), ("prompt_tokens", int),
               ("completion_tokens", int), ("beta", float), ("lr", float), ("weight_decay", float), ("threads", int)):
    p.add_argument(f"--{k}", type=t)
  p.add_argument("--remat", type=lambda s: s == "True")
  a = p.parse_args()
  if a.child:
    print(json.dumps(_child(a)), flush=True)
    return
  from benchmarks import common
  from benchmarks.update import make_config
  from seed_jax.models import load
  sets = a.set + [f"{k}.dtype={a.dtype}" for k in ("sampler", "rescore", "learner")]
  ours = {arm: _ours(arm, sets) for arm in a.arms.split(",")}
  g = ours["grpo"]
  cfg = make_config("default", False, sets)
  G = cfg.rollout.group_size
  rows = max(G, round(g["step_samples"] / G) * G)
  with tempfile.TemporaryDirectory() as d:
    model_dir = os.path.join(d, "model")
    common.export_embedded(model_dir)
    load.load_tokenizer("embedded").hf.save_pretrained(model_dir)
    kw = dict(model_dir=model_dir, out_dir=os.path.join(d, "trl"), rows=rows, group=G,
              prompt_tokens=round(g["phases"]["rollout"]["avg_prompt"]),
              completion_tokens=round(g["phases"]["rollout"]["avg_response"]), beta=cfg.objectives.kl_coef,
              lr=cfg.learner.lr, weight_decay=cfg.learner.weight_decay, remat=cfg.learner.remat,
              threads=common.TORCH_THREADS, updates=a.updates, dtype=a.dtype)
    args = [a.trl_python, os.path.abspath(__file__), "--child"] + [f"--{k}={v}" for k, v in kw.items()]
    proc = subprocess.run(args, stdout=subprocess.PIPE, text=True, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    if proc.returncode:
      raise SystemExit(f"TRL's side failed ({proc.returncode}); its log is above")
    trl = json.loads(proc.stdout.strip().splitlines()[-1])
  t, s = trl["seconds"], g["seconds"]
  out = dict(bench="trl_grpo", cpu=common.cpu_model(), load_avg=common.load_avg(), work=kw | {"model_dir": "embedded"},
             trl=trl, seed_jax={arm: dict(seconds=o["seconds"], step_samples=o["step_samples"],
                                          avg_prompt=o["phases"]["rollout"]["avg_prompt"],
                                          avg_response=o["phases"]["rollout"]["avg_response"],
                                          peak_rss_mb=o["peak_rss_mb"], ideal_s=o["ideal_s"],
                                          matmul_peak_gflops=o["matmul_peak_gflops_by_dtype"], decode=o.get("decode"),
                                          warmup_updates=o["warmup_updates"], compiles=o["compiles"],
                                          analysis_parse_rate=o["analysis_parse_rate"])
                       for arm, o in ours.items()},
             ratio={"whole_update": round(t["update"] / s["update"], 3),
                    "whole_update_without_env": round(t["update"] / (s["update"] - s["env"]), 3),
                    "generation": round(t["generation"] / s["generation"], 3),
                    "reference": round(t["reference"] / s["reference"], 3),
                    "training": round(t["training"] / s["training"], 3),
                    "ceiling_whole_update": round(t["update"] / g["ideal_s"], 3)},
             ideal_over_actual={"trl": round(g["ideal_s"] / t["update"], 3),
                                "seed_jax": round(g["ideal_s"] / s["update"], 3)})
  if "seed" in ours:
    out["seed_over_grpo_update"] = round(ours["seed"]["seconds"]["update"] / s["update"], 3)
  common.emit(out)


if __name__ == "__main__":
  main()
