"""Shared-prefix prefill (sampler.prefix_reuse_mb, seed_jax/prefix.py) against every prompt prefilled whole, on the
prompts of one update of the embedded ScienceWorld default (SmolLM2-135M): prints one JSON line.

One rollout of the untrained policy gives the step prompts and the analysis prompts of its trajectories. Then two
samplers, reuse on and off, prefill them as an update does: the rollout's first turn in one call and every later
step prompt in its own call, as rows refill (one reuse scope: the rollout), and the analysis prompts in one call.
Each side's calls sample one token (the prefill is timed apart, `Sampler.times`). One warm-up round compiles
both sides' programs; then `--rounds` rounds, the two sides alternating, so a slow spell of the host falls on both;
medians, and the positions each side computed.

  python -m benchmarks.prefix [--rounds 5]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

from benchmarks import common


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--rounds", type=int, default=5)
  a = p.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  import jax
  from benchmarks.update import make_config
  from seed_jax import pipeline, runtime, skills
  from seed_jax.sample import Sampler, SamplingParams

  cfg = make_config("default", False, [])
  rt = runtime.build(cfg)
  try:
    trajs = pipeline._rollout(rt, rt.init_params, 0, jax.random.key(0))
  finally:
    rt.close()
  count = lambda text: len(rt.tokenizer.encode_chat(text))
  by_turn: dict[int, list[list[int]]] = {}
  for t in trajs:
    for n, s in enumerate(t.steps):
      by_turn.setdefault(n, []).append(list(s.prompt_tokens))
  first, later = by_turn.pop(0), [p for n in sorted(by_turn) for p in by_turn[n]]
  analysis = [rt.tokenizer.encode_chat(skills.analysis_prompt_fitted(t, count, cfg.analyzer.max_prompt_tokens,
                                                                     cfg.analyzer.success_threshold))
              for t in trajs]
  base = rt.sampler
  sides = {"reuse": base, "whole": Sampler(base.spec, base.eos_E.tolist(),
                                           dataclasses.replace(base.cfg, prefix_reuse_mb=0), base.mesh)}
  sp = SamplingParams(temperature=1.0, max_new_tokens=1)
  key = jax.random.key(1)

  def once(s: Sampler) -> dict[str, float]:
    before, tokens = dict(s.times), s.tokens.copy()
    with s.reuse_scope():  # the rollout: its first turn together, then a prompt per refill
      s.generate(rt.init_params, first, key, sp)
      for prompt in later:
        s.generate(rt.init_params, [prompt], key, sp)
    mid, mid_tokens = dict(s.times), s.tokens.copy()
    s.generate(rt.init_params, analysis, key, sp)
    done = s.tokens - mid_tokens
    roll = mid_tokens - tokens
    return dict(rollout_s=mid["prefill_s"] - before["prefill_s"], analysis_s=s.times["prefill_s"] - mid["prefill_s"],
                rollout_positions=roll.prompt_forwarded, rollout_reused=roll.prompt_reused,
                analysis_positions=done.prompt_forwarded, analysis_reused=done.prompt_reused)

  for s in sides.values():
    once(s)  # compiles
  runs: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
  for _ in range(a.rounds):
    for k, s in sides.items():
      runs[k].append(once(s))
  med = {k: {f: statistics.median(r[f] for r in rs) for f in rs[0]} for k, rs in runs.items()}
  ratio = lambda f: round(med["whole"][f] / med["reuse"][f], 3)
  common.emit(dict(
      bench="prefix", cpu=common.cpu_model(), load_avg=common.load_avg(), rounds=a.rounds,
      prompts=dict(rollout=len(first) + len(later), rollout_tokens=sum(map(len, first + later)),
                   analysis=len(analysis), analysis_tokens=sum(map(len, analysis))),
      median={k: {f: round(v, 3) for f, v in m.items()} for k, m in med.items()},
      whole_over_reuse=dict(rollout_prefill=ratio("rollout_s"), analysis_prefill=ratio("analysis_s")),
      runs_s={k: [[round(r["rollout_s"], 3), round(r["analysis_s"], 3)] for r in rs] for k, rs in runs.items()}))


if __name__ == "__main__":
  sys.exit(main())
