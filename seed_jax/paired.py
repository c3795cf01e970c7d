"""The paired one-update test: does the skill signal move the policy the right way, before any race?

  python -m seed_jax.experiment --config=configs/textworld_express.py:experiment --mode=paired --batches=3

Per batch b: one rollout of update b with the warm-started weights, one set of skills per source (the oracle's,
the policy's own, and each shuffled across tasks: the control in the same wording), then every arm's single
update from the same state on the same samples and mini-batch draws, so the arms differ only in their loss.
Then the probe: on fixed held-out gold-path states (eval panel tasks, their gold paths played as rollouts
render them) the mean change in log-prob of the gold reply, and KL(before || after) estimated on replies sampled
from the weights before. An arm's margin is its probe gain minus GRPO's on the same batch.

The same rollouts give the teacher test (teacher_quality rows per skill source, pooled over batches).
Outputs in the workdir: paired.jsonl (one line per batch and arm), teacher.jsonl (the rows), paired.md (the
tables, paired_report.py) and paired.png. A finished batch is not redone when the command runs again.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from seed_jax import batch as batch_lib
from seed_jax import paired_report, pipeline, records, runtime, sft, teacher_quality
from seed_jax import update as update_lib
from seed_jax.config import sampling
from seed_jax.infra import machine
from seed_jax.infra.metrics import PhaseTimer
from seed_jax.paired_report import ARMS_FILE, SOURCES, TEACHER_FILE
from seed_jax.sample import SamplingParams
from seed_jax.tasks import spread

log = logging.getLogger(__name__)



@dataclasses.dataclass(frozen=True)
class Arm:
  name: str
  variant: str  # objectives.opd_variant; "none" is GRPO
  source: str | None  # key of SOURCES
  weight: float  # objectives.opd_coef ("gated") or opd_adv_coef ("teacher_adv")


def arms(weights: Sequence[float]) -> list[Arm]:
  """GRPO; gated OPD with each skill source at the first weight; the oracle's at the others; teacher_adv."""
  out = [Arm("grpo", "none", None, 0.0)]
  out += [Arm(f"opd-{s}-w{weights[0]:g}", "gated", s, weights[0]) for s in ("oracle", "oracle-shuffled", "policy")]
  out += [Arm(f"opd-oracle-w{w:g}", "gated", "oracle", w) for w in weights[1:]]
  return out + [Arm("teacher_adv-oracle", "teacher_adv", "oracle", 1.0)]


def arm_config(cfg: ml_collections.ConfigDict, arm: Arm) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(cfg.to_dict())
  c.objectives.opd_variant = arm.variant
  if arm.variant == "teacher_adv":
    c.objectives.opd_adv_coef = arm.weight
  elif arm.variant != "none":
    c.objectives.opd_coef = arm.weight
  return c


def source_config(cfg: ml_collections.ConfigDict, source: str) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(cfg.to_dict())
  c.analyzer.backend, c.analyzer.control = SOURCES[source]
  return c


# ----------------------------------------------------------------------------------------------------------
# The probe


@dataclasses.dataclass
class Probe:
  """Held-out gold-path states: their prompts, the gold reply, and replies sampled there before the update."""
  prompts: list[list[int]]
  gold: list[list[int]]
  sample_prompts: list[list[int]]
  samples: list[list[int]]


def build_probe(rt, params, num_tasks: int, per_state: int, key) -> Probe:
  from seed_jax import warmstart
  cfg = rt.cfg
  tasks = spread(rt.eval_tasks[cfg.eval.split], num_tasks)
  demos, _ = warmstart.play_demos(rt.pool, rt.family, cfg.env, rt.tokenizer, tasks,
                                  max_prompt_tokens=cfg.model.max_prompt_tokens, max_steps=cfg.env.max_steps,
                                  reasoning=cfg.warmstart.reasoning)
  eot = sft.end_of_turn_id(rt.tokenizer)
  states = [(s.prompt_tokens, rt.tokenizer.encode(s.response_text) + [eot]) for t in demos for s in t.steps]
  states = [(p, g) for p, g in states if len(g) <= cfg.rollout.max_new_tokens]
  if not states:
    raise ValueError(f"no probe state: {len(tasks)} eval tasks gave no gold-path step that fits")
  prompts = [p for p, _ in states for _ in range(per_state)]
  sp = SamplingParams(temperature=cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_new_tokens)
  gens = rt.sampler.generate(params, prompts, key, sp, rt.stop_sequences)
  return Probe([p for p, _ in states], [g for _, g in states], prompts, [g.tokens for g in gens])


def probe_logps(rt, params, probe: Probe) -> tuple[np.ndarray, np.ndarray]:
  """(gold reply log-prob per state, sampled reply log-prob per sample), each summed over the reply; one re-score
  call over both sets."""
  lp = rt.rescorer.score(params, [probe.prompts + probe.sample_prompts], probe.gold + probe.samples,
                         rt.cfg.rollout.temperature)[0][0]
  total = np.asarray([np.sum(x, dtype=np.float64) for x in lp])
  return total[:len(probe.gold)], total[len(probe.gold):]


# ----------------------------------------------------------------------------------------------------------
# One batch


def _done(workdir: str) -> set[int]:
  path = os.path.join(workdir, ARMS_FILE)
  return {r["batch"] for r in records.read_records(path) if r.get("arm") == "grpo"} if os.path.exists(path) else set()


def run_batch(rt, learners: dict[str, Any], arm_list: Sequence[Arm], probe: Probe, before, b: int,
              ) -> tuple[list[dict], list[dict]]:
  """Batch b: rollout, skills per source, teacher rows, every arm's update and probe. Returns (arm rows,
  teacher rows)."""
  params, timer = rt.init_params, PhaseTimer(progress=False)
  played = pipeline.play(rt, params, b, timer)
  gold_before, samp_before = before
  analyses, teacher_rows, source_stats = {}, [], {}
  for source in SOURCES:
    src_rt = dataclasses.replace(rt, cfg=source_config(rt.cfg, source))
    analysis, m = pipeline.self_analysis(src_rt, params, played, timer, None)
    analyses[source] = analysis
    samples = batch_lib.collect_samples(played.good, analysis.skills, rt.tokenizer, rt.cfg.model.max_prompt_tokens)
    old, skill, _ = pipeline.rescore_samples(src_rt, params, samples, with_skills=True)
    rows = teacher_quality.sample_rows(src_rt, params, played.good, samples, old, skill, u=b)
    teacher_rows += [dict(r, source=source) for r in rows]
    ok = [(t.success, p.ok) for t, p in zip(played.good, analysis.parses)]
    source_stats[source] = dict(parse_success=_rate([o for s, o in ok if s]), parse_failure=_rate([o for s, o in ok if not s]))
  base = dict(batch=b, fingerprint=played.metrics["rollout/fingerprint"], rollout_success=played.metrics.get("rollout/success"),
              rollout_invalid=played.metrics.get("rollout/invalid_action_rate"), episodes=len(played.good),
              **{f"{k}/{s}": v for s, st in source_stats.items() for k, v in st.items()})
  out = []
  for arm in arm_list:
    learner = learners[arm.name]
    state = update_lib.init_state(jax.tree.map(jnp.copy, params), learner.optimizer)
    state, m = pipeline.learn(learner, state, played, analyses.get(arm.source), played.metrics, timer, None)
    gold_after, samp_after = probe_logps(rt, state.params, probe)
    delta = jax.tree.leaves(jax.tree.map(lambda a, c: jnp.sum(jnp.square(a.astype(jnp.float32) - c)), state.params, params))
    out.append(dict(base, arm=arm.name, variant=arm.variant, source=arm.source, weight=arm.weight,
                    probe_gain=float(np.mean(gold_after - gold_before)), kl=float(np.mean(samp_before - samp_after)),
                    param_delta=float(np.sqrt(sum(float(x) for x in delta))),
                    opd_tokens=m.get("update/opd_tokens", 0.0), update_s=m.get("time/update_s")))
    log.info("paired: batch %d %s probe gain %+.4f kl %.5f", b, arm.name, out[-1]["probe_gain"], out[-1]["kl"])
  grpo = next(r["probe_gain"] for r in out if r["arm"] == "grpo")
  for r in out:
    r["margin"] = r["probe_gain"] - grpo
  return out, teacher_rows


def _rate(xs) -> float | None:
  return float(np.mean(xs)) if xs else None


def run(cfg: ml_collections.ConfigDict, workdir: str, batches: int, weights: Sequence[float],
        probe_tasks: int = 8, probe_samples: int = 4) -> dict[str, Any]:
  """Every batch not yet in the workdir, then the report (paired_report.write)."""
  from seed_jax import warmstart
  os.makedirs(workdir, exist_ok=True)
  c = ml_collections.ConfigDict(cfg.to_dict())
  c.model.path = warmstart.ensure_warm_policy(cfg) if cfg.warmstart.before_rl else cfg.model.path
  c.model.tokenizer, c.warmstart.before_rl = "", False
  c.analyzer.enabled, c.analyzer.teacher_metrics = True, False  # the teacher rows are read per source here
  rt = runtime.build(c)
  try:
    arm_list = arms(weights)
    learners = {a.name: dataclasses.replace(rt, cfg=ac, **runtime.learner(ac, rt.spec, rt.init_params,
                                                                            *runtime.learner_plan(ac)))
                for a in arm_list for ac in [arm_config(c, a)]}
    probe = build_probe(rt, rt.init_params, probe_tasks, probe_samples, jax.random.key(c.seed + 7919))
    before = probe_logps(rt, rt.init_params, probe)
    done = _done(workdir)
    for b in range(batches):
      if b in done:
        print(f"seed_jax.paired: batch {b} already done")
        continue
      print(f"seed_jax.paired: batch {b + 1}/{batches}: rollout, {len(SOURCES)} skill sources, {len(arm_list)} arms")
      rows, trows = run_batch(rt, learners, arm_list, probe, before, b)
      records.append_records(os.path.join(workdir, TEACHER_FILE), trows)
      records.append_records(os.path.join(workdir, ARMS_FILE), rows)  # last: it marks the batch done
    extra = dict(probe_states=len(probe.prompts), probe_samples=len(probe.samples), model=c.model.path,
                 cpu=machine.cpu_description())
  finally:
    rt.close()
  return paired_report.write(workdir, extra)
