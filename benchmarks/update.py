"""One SEED update (`pipeline.rl_update`: rollout -> self-analysis -> re-score -> advantages -> PPO) on the
embedded ScienceWorld default (configs/sciworld.py: SmolLM2-135M, fp32, real ScienceWorld envs), each phase's
wall time against the time its arithmetic needs at this CPU's matmul peak in the phase's dtype
(common.matmul_peak_gflops, the best of measurements before, between and after the updates: other work on the
cores only lowers them);
prints one JSON line.

The RL run's warm start is left out (`--warm` keeps it: the cached warm-started policy is the actor). One
warm-up update compiles the programs; the measured update repeats update 0's tasks from the warmed-up state, so
it shows the steady state. A repeat can still meet a new shape (its first prompts reuse the heads the last update
kept); an update that compiled anything counts as one more warm-up (`warmup_updates`, at most MAX_WARMUPS) and the
next is measured. `compiles.in_measured_update` says whether the measured one still compiled, and
`compiles.seconds_in_measured_update` how long tracing, lowering and compiling took inside it. `--rounds N` measures
N updates (each repeating update 0's tasks) and reports the one of median time, with every round's seconds in
`rounds`; `--gate` waits for the driver's go before each (benchmarks.turns: a peer benchmark's rounds alternate).

Per phase: `split` (rollout and analysis) is where the phase's time went: prefill_s and decode_s of the
sampler's calls, env_s in the environment pool (rollout), host_s the rest (rendering and tokenizing prompts,
parsing replies). Then the token positions the device computed (`forwarded_tokens`: padded buckets) and the real ones,
from the pipeline's tokens/<phase>_* metrics, and `ideal_s`, the FLOPs of the real tokens over the peak.
FLOPs per token are common.forward_flops_per_token at the phase's average row: prompt positions (prefill, or
the scored rows' prompts) run causal attention over the prompt and no vocabulary projection; response
positions (decode steps, scored responses) attend the whole prompt plus the response so far and are projected.
The update counts 3x the forward (backward = 2x; learner.remat would add one more forward).
`ideal_forwarded_s` is the same over the forwarded positions: ideal_forwarded_s / wall_s is how fast the
kernels run, ideal_s / wall_s (`ideal_over_actual`) that times the share of real tokens.
`decode` is the rollout's decode step (its time over the decode loops' iterations) against its weight-read floor
(`decode_report`); `decode_over_floor` their ratio.

  python -m benchmarks.update [--size default|big] [--warm] [--set rescore.old_logps=rescore ...]
  python -m benchmarks.update --config=sokoban --set model.path=DIR  # another env config (configs/<module>)
  python -m benchmarks.update --compare=old_logps  # rescore.old_logps=auto vs =rescore, one JSON line
  python -m benchmarks.update --compare=packing    # packed rows (the default) vs padded buckets
  python -m benchmarks.update --compare=refill     # rows that refill (the default) vs turn-by-turn rollout calls
  python -m benchmarks.update --compare=bf16       # fp32 (the default) vs bf16 matmuls in every phase
  python -m benchmarks.update --compare=prefix     # shared-prefix prefill (the default) vs every prompt whole
  python -m benchmarks.update --compare=share_prefix  # packed prefix trees (the default) vs every sequence whole
  python -m benchmarks.update --compare=remat_saves --rounds 3  # remat keeps the attention (default) vs projections

--compare runs each setting in its own child; both warm up, then they take turns, one measured update at a time
over --rounds rounds, the order alternating (benchmarks.turns), so a slow spell of the host falls on both. The
JSON line holds both children's lines, each round's ratios (second over first) of the whole update and of each
phase's wall time, their medians, and the ratio of forwarded tokens. For old_logps the update phase does the same
work in both children, so its wall ratio measures their load difference and the re-score's ratio is also given
divided by it.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Sequence

from benchmarks import common
from benchmarks.turns import Side, alternate, gate

PHASES = ("rollout", "analysis", "rescore", "update")
COMPILED = ("sampler", "rescore", "update")  # the pipeline's compiles/* counters
MAX_WARMUPS = 3
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
BIG = {"rollout.tasks_per_update": "4", "rollout.group_size": "4"}


def override(cfg, pair: str) -> None:
  """Sets `key=value` on the config, the value parsed as the field's current type."""
  key, sep, text = pair.partition("=")
  if not sep:
    raise SystemExit(f"--set wants key=value, got {pair!r}")
  *path, leaf = key.split(".")
  node = cfg
  for part in path:
    node = node[part]
  old = node[leaf]
  if isinstance(old, bool):
    if text.lower() not in ("true", "false", "1", "0"):
      raise SystemExit(f"--set {key} wants true or false, got {text!r}")
    node[leaf] = text.lower() in ("true", "1")
  elif isinstance(old, (int, float, str)):
    node[leaf] = type(old)(text)
  else:
    node[leaf] = ast.literal_eval(text)


def make_config(size: str, warm: bool, sets: Sequence[str], config: str = "sciworld"):
  """`config`: a configs/ module name with an optional variant ("sokoban", "sokoban:paper")."""
  import importlib
  from seed_jax.config import validate
  name, _, variant = config.partition(":")
  cfg = importlib.import_module(f"configs.{name}").get_config(variant)
  cfg.warmstart.before_rl = warm
  cfg.log.tensorboard, cfg.log.wandb, cfg.log.progress = False, False, False
  for pair in ([f"{k}={v}" for k, v in BIG.items()] if size == "big" else []) + list(sets):
    override(cfg, pair)
  validate(cfg)
  return cfg


def phase_flops(spec, prompt: float, response: float, rows: float) -> float:
  """Forward FLOPs of `rows` rows holding `prompt` + `response` positions in all, at the average row."""
  if not rows:
    return 0.0
  P, R = prompt / rows, response / rows
  # A response position attends P + (R + 1) / 2 keys on average: a causal row of 2P + R tokens has as many.
  return (prompt * common.forward_flops_per_token(spec, P, with_logits=False)
          + response * common.forward_flops_per_token(spec, 2 * P + R))


def phase_report(spec, m: dict[str, Any], phase: str, peak_gflops: float) -> dict[str, Any]:
  t = lambda k: float(m.get(f"tokens/{phase}_{k}", 0.0))
  wall = float(m.get(f"time/{phase}_s", 0.0))
  passes = 3 if phase == "update" else 1
  flops = lambda kind: passes * phase_flops(spec, t(kind) - t(f"response_{kind}"), t(f"response_{kind}"),
                                            t(f"rows_{kind}"))
  ideal, ideal_fwd = flops("real") / (peak_gflops * 1e9), flops("forwarded") / (peak_gflops * 1e9)
  rows = t("rows_real")
  split = {k: float(m[f"time/{phase}_{k}"]) for k in ("prefill_s", "decode_s", "env_s") if f"time/{phase}_{k}" in m}
  if split:  # where a generating phase's time goes; host_s: prompts, tokenizing, parsing, the analyzer's records
    split["host_s"] = wall - sum(split.values())
  out = dict(wall_s=round(wall, 3), forwarded_tokens=int(t("forwarded")), real_tokens=int(t("real")),
             ideal_s=round(ideal, 3), ideal_over_actual=round(ideal / wall, 4) if wall else None,
             ideal_forwarded_s=round(ideal_fwd, 3), rows=int(rows),
             avg_prompt=round((t("real") - t("response_real")) / rows, 1) if rows else 0.0,
             avg_response=round(t("response_real") / rows, 1) if rows else 0.0)
  if split:
    out["split"] = {k: round(v, 3) for k, v in split.items()}
    out["prompt_reused"] = int(t("prompt_reused"))  # prompt positions taken from shared heads, not computed
  return out


def slot_steps_over_real(m: dict[str, Any]) -> float | None:
  """Decode slot-steps the rollout and analysis computed (every row of a call, or every slot, at every step of
  its loop) over the tokens they sampled."""
  t = lambda k: sum(float(m.get(f"tokens/{p}_response_{k}", 0.0)) for p in ("rollout", "analysis"))
  return round(t("forwarded") / t("real"), 4) if t("real") else None


def decode_report(spec, m: dict[str, Any], n_params: int, dtype: str, bandwidth_gbs: float) -> dict[str, Any]:
  """The rollout's decode step against the time to read what it must read once: the weights in the sampler's
  dtype and the keys and values of its rows' real tokens (each row at its prompt plus half its reply), at the
  bandwidth measured in this run."""
  t = lambda k: float(m.get(f"tokens/rollout_{k}", 0.0))
  steps = t("decode_steps")
  if not steps:
    return {}
  rows_real = t("rows_real")
  prompt, response = (t("real") - t("response_real")) / rows_real, t("response_real") / rows_real
  rows = t("response_forwarded") / steps  # rows (slots) forwarded per step
  step_ms = float(m["time/rollout_decode_s"]) / steps * 1e3
  floor_ms = common.decode_read_floor(spec, n_params, dtype, rows, prompt + response / 2, bandwidth_gbs)[0]
  return dict(steps=int(steps), rows_per_step=round(rows, 2), ms_per_step=round(step_ms, 2),
              floor_ms=round(floor_ms, 2), floor_s=round(steps * floor_ms / 1e3, 3),
              bandwidth_gbs=round(bandwidth_gbs, 1), dtype=dtype)


def new_compiles(before: dict[str, Any], after: dict[str, Any]) -> int:
  """Programs compiled between two updates' metrics (their compiles/* counts are the run's totals so far)."""
  return sum(int(after.get(f"compiles/{k}", 0)) - int(before.get(f"compiles/{k}", 0)) for k in COMPILED)


@dataclasses.dataclass(frozen=True)
class Round:
  """One measured update: its wall seconds, the pipeline's metrics, and what it compiled."""
  seconds: float
  metrics: dict[str, Any]
  compile_s: float
  compiles: int

  def report(self) -> dict[str, Any]:
    m = self.metrics
    split = {k: round(float(m.get(f"time/rollout_{k}", 0.0)), 3) for k in ("prefill_s", "decode_s", "env_s")}
    return dict(update_s=round(self.seconds, 2), compiles=self.compiles, compile_s=round(self.compile_s, 2),
                wall_s={p: round(float(m.get(f"time/{p}_s", 0.0)), 3) for p in PHASES}, rollout_split=split)


def update_shapes(spec, m: dict[str, Any], passes: int) -> dict[str, Any]:
  """What a peer needs to do the same work as this update: step-samples and their average lengths (`passes`:
  update rows per step-sample)."""
  roll = phase_report(spec, m, "rollout", 1.0)
  return dict(step_samples=int(m.get("tokens/update_rows_real", 0)) // passes, avg_prompt=roll["avg_prompt"],
              avg_response=roll["avg_response"])


def run_update(a) -> dict[str, Any]:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  import jax
  compile_s: dict[str, float] = {}

  def on_duration(event: str, seconds: float, **_):
    if event in COMPILE_EVENTS:
      compile_s[event] = compile_s.get(event, 0.0) + seconds

  jax.monitoring.register_event_duration_secs_listener(on_duration)
  import jax.numpy as jnp
  from seed_jax import pipeline, runtime
  from seed_jax import update as update_lib
  from seed_jax.infra.metrics import MetricsWriter
  load_start = common.load_avg()
  cfg = make_config(a.size, a.warm, a.set, a.config)
  if cfg.compile_cache.enabled:  # as seed_jax.main: a later run reads the compiled programs back
    from seed_jax.infra import compile_cache
    compile_cache.enable(cfg.compile_cache.dir, cfg.compile_cache.min_compile_time_s)
  t0 = time.perf_counter()
  if cfg.warmstart.before_rl:
    from seed_jax import warmstart
    cfg = warmstart.with_warm_policy(cfg)
  rt = runtime.build(cfg)
  build_s = time.perf_counter() - t0
  passes = cfg.learner.ppo_epochs * (2 if rt.teacher.update_reads_skill_prompts else 1)  # update rows per sample
  # Each phase's ideal at the peak of its own matmul dtype (the sampler's, the re-score's, the learner's)
  dtypes = {"rollout": cfg.sampler.dtype, "analysis": cfg.sampler.dtype, "rescore": cfg.rescore.dtype,
            "update": cfg.learner.dtype}
  peaks: dict[str, list[float]] = {d: [] for d in sorted(set(dtypes.values()))}

  def measure_peaks():
    for d in peaks:
      peaks[d].append(common.matmul_peak_gflops(dtype=d))

  measure_peaks()
  try:
    with tempfile.TemporaryDirectory() as workdir:
      writer = MetricsWriter(workdir, True, cfg.log)
      state = update_lib.init_state(jax.tree.map(jnp.copy, rt.init_params), rt.optimizer)
      t0 = time.perf_counter()
      state, warm_m = pipeline.rl_update(rt, state, 0, writer)
      warmup_s = time.perf_counter() - t0
      measure_peaks()
      load_measured = common.load_avg()
      # A repeated update can still take new shapes (e.g. its first prompts now reuse the heads the last one kept);
      # an update that compiled counts as one more warm-up and the next one is measured, MAX_WARMUPS at most.
      for warmups in range(1, MAX_WARMUPS + 1):
        compile_s.clear()
        t0 = time.perf_counter()
        state, m = pipeline.rl_update(rt, state, 0, writer)
        measured_s = time.perf_counter() - t0
        if not new_compiles(warm_m, m) or warmups == MAX_WARMUPS:
          break
        warmup_s, warm_m = warmup_s + measured_s, m
      rounds = [Round(measured_s, m, sum(compile_s.values()), new_compiles(warm_m, m))]
      if a.gate:  # the driver's rounds start now: the update above was one more warm-up
        warmup_s, warmups, rounds = warmup_s + measured_s, warmups + 1, []
        gate(dict(ready=True, **update_shapes(rt.spec, m, passes)))
      while len(rounds) < a.rounds:
        compile_s.clear()
        t0 = time.perf_counter()
        state, m_next = pipeline.rl_update(rt, state, 0, writer)
        rounds.append(Round(time.perf_counter() - t0, m_next, sum(compile_s.values()), new_compiles(m, m_next)))
        m = m_next
        if a.gate:  # the peaks are measured inside this side's turn, while the other sides wait
          measure_peaks()
          if len(rounds) < a.rounds:
            gate({"round": len(rounds) - 1, "update_s": round(rounds[-1].seconds, 2)})
      writer.close()
  finally:
    rt.close()
  measure_peaks()
  peak = {d: max(v) for d, v in peaks.items()}
  median = sorted(rounds, key=lambda r: r.seconds)[len(rounds) // 2]  # its phases are reported
  m, measured_s = median.metrics, median.seconds
  phases = {p: phase_report(rt.spec, m, p, peak[dtypes[p]]) for p in PHASES}
  n_params = sum(x.size for x in jax.tree.leaves(rt.init_params))
  dec = decode_report(rt.spec, m, n_params, cfg.sampler.dtype, common.stream_bandwidth_gbs())
  wall = lambda ps: sum(phases[p]["wall_s"] for p in ps)
  outside = ("analysis", "rescore", "update")
  fwd = sum(phases[p]["forwarded_tokens"] for p in ("rescore", "update"))
  compiles = {k: int(m.get(f"compiles/{k}", 0)) for k in COMPILED}
  compiles["in_measured_update"] = median.compiles
  compiles["seconds_in_measured_update"] = round(median.compile_s, 2)  # tracing, lowering, XLA
  return dict(
      bench="update", cpu=common.cpu_model(), load_avg=dict(start=load_start, measured=load_measured, end=common.load_avg()),
      matmul_peak_gflops=round(peak["float32"] if "float32" in peak else max(peak.values()), 1),
      matmul_peak_gflops_by_dtype={d: round(v, 1) for d, v in peak.items()},
      matmul_peak_gflops_runs={d: [round(x, 1) for x in v] for d, v in peaks.items()}, model=cfg.model.path,
      config=a.config, size=a.size, warm=a.warm, set=list(a.set), tasks_per_update=cfg.rollout.tasks_per_update,
      group_size=cfg.rollout.group_size, step_samples=int(m.get("tokens/update_rows_real", 0)) // passes,
      phases=phases,
      analysis_rescore_over_rollout=round(wall(("analysis", "rescore")) / wall(("rollout",)), 4),
      efficiency_outside_rollout=round(sum(phases[p]["ideal_s"] for p in outside) / wall(outside), 4),
      real_over_forwarded=round(sum(phases[p]["real_tokens"] for p in ("rescore", "update")) / fwd, 4) if fwd else None,
      decode_slot_steps_over_real=slot_steps_over_real(m), refill=bool(cfg.sampler.refill), decode=dec,
      decode_over_floor=round(dec["ms_per_step"] / dec["floor_ms"], 2) if dec else None,
      compiles=compiles, peak_rss_mb=round(common.peak_rss_mb()),
      old_logps_from_sampler=bool(m.get("rescore/old_logps_from_sampler", 0.0)),
      old_logps_from_update=bool(m.get("rescore/old_logps_from_update", 0.0)),
      build_s=round(build_s, 1), warmup_updates=warmups, warmup_update_s=round(warmup_s, 1),
      measured_update_s=round(measured_s, 1), rounds=[r.report() for r in rounds],
      rollout_success=m.get("rollout/success"), analysis_parse_rate=m.get("analysis/parse_rate"))


COMPARE = {  # name -> (first child's settings, second child's settings)
    "old_logps": (["rescore.old_logps=auto"], ["rescore.old_logps=rescore"]),
    "packing": ([], ["learner.pack_length=0", "rescore.pack_length=0"]),
    "refill": ([], ["sampler.refill=False"]),  # rows that refill (the default) vs turn by turn
    "prefix": ([], ["sampler.prefix_reuse_mb=0"]),  # shared-prefix prefill (the default) vs every prompt whole
    # packed rows as prefix trees (the default) vs every sequence whole, in the re-score and the update
    "share_prefix": ([], ["rescore.share_prefix=false", "learner.share_prefix=false"]),
    # a rematerialized layer keeps its input and the attention's output (the default) vs also every projection's
    "remat_saves": ([], ["learner.remat_saves=projections"]),
    # fp32 (the default) vs bf16 matmuls in every phase (fp32 master weights, norms, softmax and loss)
    "bf16": ([], ["sampler.dtype=bfloat16", "rescore.dtype=bfloat16", "learner.dtype=bfloat16"]),
}


def child(a, name: str, settings: Sequence[str]) -> Side:
  """This benchmark in a gated child process (its own peak memory and compile counts) with `settings` added."""
  args = [sys.executable, "-m", "benchmarks.update", "--child", "--gate", f"--rounds={a.rounds}", "--size", a.size,
          "--config", a.config] + (["--warm"] if a.warm else [])
  for pair in list(a.set) + list(settings):
    args += ["--set", pair]
  env = dict(os.environ, JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
  return Side(name, args, cwd=common.ROOT, env=env)  # stderr: the run's log


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--size", choices=("default", "big"), default="default")
  p.add_argument("--config", default="sciworld", help="configs/ module[:variant], e.g. sokoban")
  p.add_argument("--warm", action="store_true", help="keep the RL run's warm start (the cached warm policy acts)")
  p.add_argument("--set", action="append", default=[], help="config override key=value (repeatable)")
  p.add_argument("--compare", choices=sorted(COMPARE), help="two children, one per setting of COMPARE[name]")
  p.add_argument("--child", action="store_true", help="one run, as a child of --compare")
  p.add_argument("--rounds", type=int, default=1, help="measured updates after the warm-ups; the median is reported")
  p.add_argument("--gate", action="store_true", help="wait for a stdin line before each measured update (a driver's)")
  a = p.parse_args()
  if not a.compare:
    import logging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    for name in ("absl", "jax"):  # backend probes and cache writes, not the run
      logging.getLogger(name).setLevel(logging.WARNING)
    common.emit(run_update(a))
    return
  first_set, second_set = COMPARE[a.compare]
  keys = {s.split("=")[0] for s in first_set + second_set}
  if any(s.split("=")[0] in keys for s in a.set):
    raise SystemExit(f"--compare={a.compare} sets {', '.join(sorted(keys))} itself")
  sides = [child(a, "first", first_set), child(a, "second", second_set)]
  try:
    for side in sides:  # both warm up (at once), then take turns
      side.report()
    finals = alternate(sides, a.rounds)
  finally:
    for side in sides:
      side.close()
  first, second = finals["first"], finals["second"]
  # Each round's second over first (the two measured minutes apart), then their median.
  per_round = lambda get: [round(get(s) / get(f), 3) if get(f) else None for f, s in zip(first["rounds"], second["rounds"])]
  median = lambda xs: statistics.median(x for x in xs if x is not None) if any(x is not None for x in xs) else None
  phases = [k for k in first["phases"] if k in second["phases"]]
  wall_rounds = {k: per_round(lambda r, k=k: r["wall_s"][k]) for k in phases}
  fwd = lambda k: second["phases"][k]["forwarded_tokens"] / first["phases"][k]["forwarded_tokens"] \
      if first["phases"][k]["forwarded_tokens"] else None
  update_rounds = per_round(lambda r: r["update_s"])
  out = dict(bench="update_compare", compare=a.compare, cpu=first["cpu"], load_avg=common.load_avg(), rounds=a.rounds,
             first=dict(settings=first_set, **first), second=dict(settings=second_set, **second),
             wall_second_over_first={k: median(v) for k, v in wall_rounds.items()}, wall_rounds=wall_rounds,
             forwarded_second_over_first={k: fwd(k) for k in phases},
             update_wall_second_over_first=median(update_rounds), update_wall_rounds=update_rounds)
  if a.compare == "old_logps":
    out["rescore_wall_ratio_load_adjusted"] = round(median(wall_rounds["rescore"]) / median(wall_rounds["update"]), 3)
  common.emit(out)


if __name__ == "__main__":
  main()
