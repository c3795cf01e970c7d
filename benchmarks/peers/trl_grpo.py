"""seed_jax's whole GRPO update (and the SEED arm's) against TRL's own `GRPOTrainer` on the same work on this
machine; prints one JSON line with per-phase seconds and TRL's time over seed_jax's.

The sides take turns (benchmarks.turns): every side is a live child that warms up, then runs one measured update
each time the driver says, one side at a time, their order rotated from round to round (TRL, GRPO, SEED; then
GRPO, SEED, TRL; ...). A slow spell of the host (single runs of either side moved by ~20 % between runs on these
machines) so falls on every side, and each round's ratio compares updates measured minutes apart. `ratio` holds
the medians of the per-round ratios, `ratio_rounds` every round's.

seed_jax's side is `benchmarks.update --gate` (a child per arm: the embedded ScienceWorld default, SmolLM2-135M
fp32; its warm-up updates, then each round repeats update 0's tasks). TRL's side runs in a Python that has TRL
(its own venv; this file needs nothing of seed_jax there): the same weights and tokenizer (exported to an HF
folder), as many rows as the GRPO arm's step-samples in its last warm-up (rounded to a multiple of the group size;
each prompt sampled group-size times), prompts of the GRPO arm's average prompt length, completions forced to its
average response length (min_new_tokens = max_completion_length), KL to the reference (beta = learner's kl_coef),
AdamW at the learner's settings, gradient checkpointing (learner.remat), 2 threads; one optimizer step per update
as the learner's; one warm-up update. TRL's phases: `generation` (its `_generate`), `reference` (the reference
model's log-probs), `training` (the rest of the step: forward, backward, optimizer, reward bookkeeping).

`ratio.ceiling_whole_update` bounds what any implementation could show on this work here: TRL's whole update over
the GRPO arm's FLOP-ideal time (every phase's real tokens at the matmul peak of its dtype, measured in seed_jax's
run; decode counted by its FLOPs, not its weight reads, and no recomputed forward: a bound from below on the time,
so from above on the ratio). `ideal_over_actual`: that ideal time over each side's whole update (medians).

`--dtype=bfloat16` compares mixed precision on CPUs with native bf16 (AVX512_BF16 / AMX): seed_jax's
`sampler.dtype`, `rescore.dtype` and `learner.dtype` at bfloat16 (fp32 master weights and loss), TRL's `bf16=True`
(the Trainer's CPU autocast: fp32 weights, bf16 matmuls). The default is fp32 on both sides.

Install TRL once, in its own venv (its pins differ from the project's):
  python -m venv /tmp/trl && /tmp/trl/bin/pip install trl==1.16.0 torch==2.13.0 transformers==5.24.0
  python -m benchmarks.peers.trl_grpo --trl_python /tmp/trl/bin/python [--rounds 3] [--arms grpo,seed] \
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
  """TRL's side (run by the Python that has TRL): a warm-up update, then one update per turn the driver gives."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  from benchmarks.turns import gate
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
    def on_step_begin(self, args, state, *_, **__):
      if state.global_step:  # the first update warms up; each later one is a round, run when the driver says
        gate({"ready": True} if state.global_step == 1 else {"round": state.global_step - 2})
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
  import trl  # the driver takes the rounds' phases and medians from per_update
  return dict(side="trl", trl=trl.__version__, torch=torch.__version__, threads=a.threads, bf16=cfg.bf16,
              shapes=shapes, per_update={k: [round(x, 3) for x in v] for k, v in times.items()})


def _ours(arm: str, sets: list[str], rounds: int):
  """benchmarks.update's child for one arm, gated: it warms up, reports its work's shapes, then waits for turns."""
  from benchmarks import common
  from benchmarks.turns import Side
  args = [sys.executable, "-m", "benchmarks.update", "--child", "--gate", f"--rounds={rounds}"]
  for pair in (["analyzer.enabled=false"] if arm == "grpo" else []) + sets:
    args += ["--set", pair]
  return Side(arm, args, cwd=common.ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false"))


def _our_seconds(r: dict) -> dict[str, float]:
  """One round of benchmarks.update in TRL's phases."""
  split, wall = r["rollout_split"], r["wall_s"]
  return dict(generation=split["prefill_s"] + split["decode_s"], env=split["env_s"], rollout=wall["rollout"],
              analysis=wall["analysis"], reference=wall["rescore"], training=wall["update"], update=r["update_s"])


def _trl_seconds(per_update: dict[str, list[float]]) -> list[dict[str, float]]:
  """TRL's rounds (its updates after the warm-up) in the same phases."""
  out = []
  for gen, ref, upd in list(zip(per_update["generation"], per_update["reference"], per_update["update"]))[1:]:
    out.append(dict(generation=gen, reference=ref, training=upd - gen - ref, update=upd))
  return out


def _median(rounds: list[dict[str, float]]) -> dict[str, float]:
  return {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}


def plot(out: dict, path: str) -> None:
  """Left: each side's median update split into its phases; right: every round's whole update, per side."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from seed_jax.report import save_figure
  sides = {"TRL": out["trl"]["seconds"], **{f"seed_jax {arm}": o["seconds"] for arm, o in out["seed_jax"].items()}}
  phases = ("generation", "env", "analysis", "reference", "training")
  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
  for i, (name, sec) in enumerate(sides.items()):
    x = 0.0
    for j, ph in enumerate(phases + ("other",)):
      w = sec.get(ph, 0.0) if ph != "other" else sec["update"] - sum(sec.get(q, 0.0) for q in phases)
      left.barh(i, w, left=x, color=f"C{j}", label=ph if i == 0 else None)
      x += w
  left.set_yticks(range(len(sides)), list(sides))
  fig.suptitle(f"one GRPO update against TRL, {out['work']['dtype']}: {out['cpu']}", fontsize=10)
  left.set_title(f"median update ({out['rounds']} rounds)")
  rounds = {"TRL": out["trl"]["rounds"], **{f"seed_jax {arm}": o["rounds"] for arm, o in out["seed_jax"].items()}}
  for name, rs in rounds.items():
    right.plot(range(1, len(rs) + 1), [r["update"] for r in rs], "o-", label=name)
  right.set_ylim(bottom=0)
  right.set_title("whole update per round, seconds")
  left.set_xlabel("seconds (reference: the SEED arm's re-score of both contexts)")
  left.legend(loc="upper center", bbox_to_anchor=(0.5, 1.0), ncol=6, fontsize=7, frameon=False)
  left.set_ylim(-0.5, len(sides))
  save_figure(fig, [right], path, "round")
  print(f"wrote {path}", file=sys.stderr)


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--trl_python", default=sys.executable, help="a Python with trl, torch and transformers")
  p.add_argument("--rounds", type=int, default=3, help="measured updates per side, the sides taking turns")
  p.add_argument("--arms", default="grpo,seed")
  p.add_argument("--set", action="append", default=[], help="config override for seed_jax's side, key=value")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="matmuls on both sides")
  p.add_argument("--png", help="also draw the phases and rounds here")
  p.add_argument("--child", action="store_true")
  for k, t in (("model_dir", str), ("out_dir", str), ("rows", int), ("group", int), ("prompt_tokens", int),
               ("completion_tokens", int), ("beta", float), ("lr", float), ("weight_decay", float), ("threads", int),
               ("updates", int)):
    p.add_argument(f"--{k}", type=t)
  p.add_argument("--remat", type=lambda s: s == "True")
  a = p.parse_args()
  if a.child:
    print(json.dumps(_child(a)), flush=True)
    return
  from benchmarks import common
  from benchmarks.turns import Side, alternate
  from benchmarks.update import make_config
  from seed_jax.models import load
  sets = a.set + [f"{k}.dtype={a.dtype}" for k in ("sampler", "rescore", "learner")]
  arms = a.arms.split(",")
  if arms[0] != "grpo":
    raise SystemExit(f"--arms must start with grpo (TRL's work is the GRPO arm's), got {a.arms!r}")
  cfg = make_config("default", False, sets)
  G = cfg.rollout.group_size
  sides: list[Side] = []
  with tempfile.TemporaryDirectory() as d:
    try:
      # The GRPO arm warms up alone: its work's shapes set TRL's. The others then warm up together.
      sides.append(_ours("grpo", sets, a.rounds))
      shapes = sides[0].report()
      model_dir = os.path.join(d, "model")
      common.export_embedded(model_dir)
      load.load_tokenizer("embedded").hf.save_pretrained(model_dir)
      kw = dict(model_dir=model_dir, out_dir=os.path.join(d, "trl"),
                rows=max(G, round(shapes["step_samples"] / G) * G), group=G,
                prompt_tokens=round(shapes["avg_prompt"]), completion_tokens=round(shapes["avg_response"]),
                beta=cfg.objectives.kl_coef, lr=cfg.learner.lr, weight_decay=cfg.learner.weight_decay,
                remat=cfg.learner.remat, threads=common.TORCH_THREADS, updates=a.rounds + 1, dtype=a.dtype)
      trl_args = [a.trl_python, os.path.abspath(__file__), "--child"] + [f"--{k}={v}" for k, v in kw.items()]
      sides.append(Side("trl", trl_args, env=dict(os.environ, TOKENIZERS_PARALLELISM="false")))
      sides += [_ours(arm, sets, a.rounds) for arm in arms[1:]]
      for side in sides[1:]:
        side.report()
      finals = alternate([sides[1], sides[0], *sides[2:]], a.rounds)  # TRL first in round 1
    finally:
      for side in sides:
        side.close()
  trl = finals.pop("trl")
  t_rounds = _trl_seconds(trl["per_update"])
  o_rounds = {arm: [_our_seconds(r) for r in finals[arm]["rounds"]] for arm in arms}
  ideal = {arm: round(sum(ph["ideal_s"] for ph in finals[arm]["phases"].values()), 3) for arm in arms}
  g_rounds, ideal_s = o_rounds["grpo"], ideal["grpo"]
  per_round = lambda k, ours=g_rounds: [round(t[k] / s[k], 3) for t, s in zip(t_rounds, ours)]
  t, s = _median(t_rounds), _median(g_rounds)
  out = dict(bench="trl_grpo", cpu=common.cpu_model(), load_avg=common.load_avg(), rounds=a.rounds,
             order="the sides take turns, one at a time, their order rotated each round (TRL first in round 1)",
             work=kw | {"model_dir": "embedded"},
             trl=dict(trl, seconds=t, rounds=t_rounds),
             seed_jax={arm: dict(seconds=_median(o_rounds[arm]), rounds=o_rounds[arm], step_samples=o["step_samples"],
                                 avg_prompt=o["phases"]["rollout"]["avg_prompt"],
                                 avg_response=o["phases"]["rollout"]["avg_response"],
                                 peak_rss_mb=o["peak_rss_mb"], ideal_s=ideal[arm],
                                 matmul_peak_gflops=o["matmul_peak_gflops_by_dtype"], decode=o.get("decode"),
                                 warmup_updates=o["warmup_updates"], compiles=o["compiles"],
                                 compiles_per_round=[r["compiles"] for r in o["rounds"]],
                                 analysis_parse_rate=o["analysis_parse_rate"])
                       for arm, o in ((arm, finals[arm]) for arm in arms)},
             # Medians of the per-round ratios (each round's sides measured minutes apart), and every round's.
             ratio={"whole_update": statistics.median(per_round("update")),
                    "whole_update_without_env": statistics.median(
                        round(t_["update"] / (s_["update"] - s_["env"]), 3) for t_, s_ in zip(t_rounds, g_rounds)),
                    **{k: statistics.median(per_round(k)) for k in ("generation", "reference", "training")},
                    "ceiling_whole_update": round(t["update"] / ideal_s, 3)},
             ratio_rounds={k: per_round(k) for k in ("update", "generation", "reference", "training")},
             ideal_over_actual={"trl": round(ideal_s / t["update"], 3), "seed_jax": round(ideal_s / s["update"], 3)})
  if "seed" in o_rounds:
    seed_over = [round(x["update"] / y["update"], 3) for x, y in zip(o_rounds["seed"], g_rounds)]
    out["seed_over_grpo_update"], out["seed_over_grpo_rounds"] = statistics.median(seed_over), seed_over
  common.emit(out)
  if a.png:
    plot(out, a.png)


if __name__ == "__main__":
  main()
