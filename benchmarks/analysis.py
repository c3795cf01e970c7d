"""The policy's self-analysis under decoding options, on the same trajectories: does the reply parse, how long
is it, what does it cost, and does its skill teach (teacher_quality: the gap, gold_gain, auc)?

Rollouts of updates 0 .. --updates-1 from the starting weights (the embedded default's warm-started policy unless
--set says otherwise), each analysed once per `--ngrams` value (analyzer.no_repeat_ngram; 0 = plain greedy)
with the same key, so the settings differ only in their decoding. A first analysis per setting compiles its
programs; decode_s counts the calls after it. gold_gain_ci95 is clustered by state; gold_gain_vs_first pairs each
later setting with the first on the states both scored. One JSON line with the CPU.

  python -m benchmarks.analysis [--updates 3] [--ngrams 0,8] [--config sciworld] [--set key=value ...]
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np

from benchmarks import common
from benchmarks.update import make_config


def analyse(rt, played, ngram: int) -> tuple[dict, list[dict]]:
  """Every update's trajectories analysed with analyzer.no_repeat_ngram=ngram; the summary and the teacher rows."""
  import jax
  from seed_jax import batch as batch_lib
  from seed_jax import pipeline, teacher_quality
  rt.cfg.analyzer.no_repeat_ngram = ngram
  pipeline._analyze(rt, rt.init_params, played[0].good, jax.random.fold_in(played[0].key, 1))  # compiles
  before, t0 = rt.sampler.tokens.copy(), rt.sampler.times["decode_s"]
  parses, lengths, rows, replies = [], [], [], []
  wall = time.perf_counter()
  for p in played:
    analysis = pipeline._analyze(rt, rt.init_params, p.good, jax.random.fold_in(p.key, 1))
    parses += analysis.parses
    replies += analysis.replies
    lengths += [len(rt.tokenizer.encode(r)) for r in analysis.replies]
    samples = batch_lib.collect_samples(p.good, analysis.skills, rt.tokenizer, rt.cfg.model.max_prompt_tokens)
    if samples.opd_mask_N.any():
      old = rt.rescorer.score(rt.init_params, [samples.prompts], samples.responses, rt.cfg.rollout.temperature)[0][0]
      rows += teacher_quality.sample_rows(rt, rt.init_params, p.good, samples, old, None, p.u)
  tokens = rt.sampler.tokens - before
  gains = [(r["gold_gain"], r["state"]) for r in rows if r["gold_gain"] is not None]
  ci = teacher_quality.clustered_mean([g for g, _ in gains], [s for _, s in gains])[1:]  # clustered by state
  return dict(
      no_repeat_ngram=ngram, replies=len(parses), parse_rate=rnd(np.mean([q.ok for q in parses])),
      salvaged_rate=rnd(np.mean([q.salvaged for q in parses])),
      reply_tokens_mean=rnd(np.mean(lengths)), at_cap=int(sum(n >= rt.cfg.analyzer.max_new_tokens for n in lengths)),
      decode_steps=tokens.decode_steps, decode_s=round(rt.sampler.times["decode_s"] - t0, 2),
      wall_s=round(time.perf_counter() - wall, 1),
      teacher={k.split("/")[1]: rnd(v) for k, v in teacher_quality.metrics(rows).items()},
      gold_gain_ci95=[rnd(x) for x in ci], examples=[r[:240] for r in replies[:3]]), rows


def rnd(x):
  return None if x is None or np.isnan(x) else round(float(x), 4)


def paired_gain(rows: list[dict], first: list[dict]) -> dict:
  """The gold gain of `rows` minus the first setting's on the same states (teacher_quality.paired_by_state)."""
  from seed_jax import teacher_quality
  mean, lo, hi, states = teacher_quality.paired_by_state(rows, first)
  return dict(mean=rnd(mean), ci95=[rnd(lo), rnd(hi)], states=states)


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--config", default="sciworld", help="configs/ module[:variant]")
  p.add_argument("--updates", type=int, default=3, help="rollouts analysed (updates 0 .. n-1 of the run's tasks)")
  p.add_argument("--ngrams", default="0,8", help="analyzer.no_repeat_ngram values, comma-separated")
  p.add_argument("--set", action="append", default=[], help="config override key=value (repeatable)")
  a = p.parse_args()
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
  for name in ("absl", "jax"):
    logging.getLogger(name).setLevel(logging.WARNING)
  from seed_jax import pipeline, runtime, warmstart
  from seed_jax.infra.metrics import PhaseTimer
  cfg = make_config("default", True, a.set, a.config)
  if cfg.warmstart.before_rl:
    cfg = warmstart.with_warm_policy(cfg)
  rt = runtime.build(cfg)
  try:
    played = [pipeline.play(rt, rt.init_params, u, PhaseTimer(progress=False)) for u in range(a.updates)]
    arms, rows = zip(*[analyse(rt, played, int(n)) for n in a.ngrams.split(",")])
  finally:
    rt.close()
  common.emit(dict(bench="analysis", config=a.config, set=a.set, model=cfg.model.path,
                   trajectories=sum(len(x.good) for x in played),
                   rollout_success=round(float(np.mean([t.success for x in played for t in x.good])), 4),
                   max_new_tokens=cfg.analyzer.max_new_tokens, arms=list(arms),
                   gold_gain_vs_first=[paired_gain(r, rows[0]) for r in rows[1:]]))


if __name__ == "__main__":
  main()
