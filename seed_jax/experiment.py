"""Arms x seeds through the normal pipeline, from one shared warm start, with curves and a table.

  python -m seed_jax.experiment --config=configs/textworld_express.py:experiment --arms=seed,grpo --seeds=0,1,2

Every run is `loop.train` in its own folder <workdir>/<arm>-s<seed> (resumable from its checkpoints); a
finished run leaves `run_done.json`, so a killed experiment continues with the runs not yet finished and never
repeats one. The evaluations (fixed panel, before training and every `eval.every` updates) are gathered into
`experiment.jsonl`, `curves.png` and `summary.md`; arms share every random key, so summary.md also pairs each arm
with the baseline seed by seed and episode by episode (seed_jax/paired_stats.py) and says when their rollouts
first differ.
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, Callable, Sequence

import ml_collections
import numpy as np

from seed_jax import evaluate, paired_stats, records, report
from seed_jax.infra import machine
from seed_jax.infra.metrics import MetricsWriter

DONE_FILE = "run_done.json"
DUMPS = ml_collections.ConfigDict(dict(dump_subdir="dumps"))  # the runs' log.dump_subdir (the default)


def _seed_arm(c: ml_collections.ConfigDict) -> None:
  c.analyzer.enabled = True


def _grpo_arm(c: ml_collections.ConfigDict) -> None:
  c.analyzer.enabled = False  # the same code path without analysis and OPD


ARMS: dict[str, Callable[[ml_collections.ConfigDict], None]] = {"seed": _seed_arm, "grpo": _grpo_arm}
COLORS = {"seed": "tab:blue", "grpo": "tab:orange"}


def parse_arms(text: str) -> list[str]:
  arms = [a.strip() for a in text.split(",") if a.strip()]
  bad = [a for a in arms if a not in ARMS]
  if not arms or bad:
    raise ValueError(f"unknown experiment arm(s) {bad or text!r}; known: {', '.join(sorted(ARMS))}")
  return arms


def parse_seeds(text: str) -> list[int]:
  try:
    seeds = [int(s) for s in text.split(",") if s.strip()]
  except ValueError:
    raise ValueError(f"--seeds={text!r} must be comma-separated integers") from None
  if not seeds:
    raise ValueError("--seeds is empty")
  return seeds


def run_config(cfg: ml_collections.ConfigDict, arm: str, seed: int, model_path: str) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(cfg.to_dict())
  ARMS[arm](c)
  c.seed = seed
  c.model.path = model_path
  c.warmstart.before_rl = False  # the experiment's shared warm start is model_path
  c.eval.at_start = True
  return c


def eval_curve(metrics_path: str) -> list[dict[str, Any]]:
  """The run's evaluation records in update order: {updates, success, return} (first eval split, at the first
  eval temperature: evaluate writes that panel's keys first)."""
  out = []
  for r in records.read_records(metrics_path):
    if "eval/updates_done" in r:
      split = next(k.split("/")[1] for k in r if k.startswith("eval/") and k.endswith("/success"))
      out.append(dict(updates=int(r["eval/updates_done"]), success=r[f"eval/{split}/success"],
                      ret=r[f"eval/{split}/return"]))
  return sorted(out, key=lambda e: e["updates"])


def train_curve(metrics_path: str) -> list[dict[str, Any]]:
  """Per update: skill-parse rate, mean OPD gate and gap, rollout success, the rollout fingerprint (an exact
  integer) and the teacher's on/off-gold AUC and gold-reply gain (teacher_quality.py); absent keys are NaN."""
  get = lambda r, k: math.nan if r.get(k) is None else float(r[k])  # NaN is written as null
  fp = lambda r: r["rollout/fingerprint"] if isinstance(r.get("rollout/fingerprint"), (int, float)) else math.nan
  return [dict(updates=int(r["step"]) + 1, parse=get(r, "analysis/parse_rate"), gate=get(r, "update/opd_gate_mean"),
               gap=get(r, "update/opd_gap_mean"), success=get(r, "rollout/success"), fingerprint=fp(r),
               auc=get(r, "teacher/auc"), gold_gain=get(r, "teacher/gold_gain"))
          for r in records.read_records(metrics_path) if "rollout/return" in r]


def final_episodes(rundir: str, curve: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """The episode rows of the run's last evaluation (its eval_episodes dump; [] without one)."""
  if not curve:
    return []
  path = MetricsWriter(rundir, False, DUMPS).dump_path(evaluate.EPISODE_DUMP, curve[-1]["updates"])
  return records.read_records(path)


def plot(results: dict[str, dict[int, dict]], path: str) -> None:
  """Eval success and return per arm (thin: seeds; thick: mean; band: ±1 s.e.), and the SEED arm's
  skill-parse rate and OPD gate / gap."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  for ax, key, label in ((axes[0], "success", "eval success"), (axes[1], "ret", "eval return")):
    for arm, runs in results.items():
      curves = [r["eval"] for r in runs.values() if r["eval"]]
      if not curves:
        continue
      n = min(len(c) for c in curves)
      x = [e["updates"] for e in curves[0][:n]]
      ys = [[e[key] for e in c[:n]] for c in curves]
      for y in ys:
        ax.plot(x, y, color=COLORS.get(arm), alpha=0.35, linewidth=0.8)
      m, se = paired_stats.mean_se(ys)
      ax.plot(x, m, color=COLORS.get(arm), linewidth=2.5, label=f"{arm} (n={len(ys)})")
      ax.fill_between(x, m - se, m + se, color=COLORS.get(arm), alpha=0.2)
    ax.set_ylabel(label)
  ax = axes[2]
  for arm, runs in results.items():
    if arm != "seed":
      continue
    for name, style in (("parse", "-"), ("gate", "--"), ("gap", ":"), ("auc", "-."), ("gold_gain", (0, (1, 3)))):
      curves = [[e[name] for e in r["train"]] for r in runs.values() if r["train"]]
      if curves:
        n = min(map(len, curves))
        m, _ = paired_stats.mean_se([c[:n] for c in curves])
        ax.plot(range(1, n + 1), m, linestyle=style, color=COLORS["seed"], label=f"seed: {name}")
  ax.set_title("skill parse, OPD gate / gap, teacher AUC / gold gain (SEED)")
  report.save_figure(fig, axes, path, "update", dpi=110)


def summarize(results: dict[str, dict[int, dict]], baseline: str = "grpo") -> str:
  """Markdown: final eval success per arm (mean ± s.e. over seeds), the warm start's, and the updates each
  arm needs (mean curve) to reach the baseline arm's final success; then each arm paired with the baseline
  (paired_table) and the update where their rollouts first differ (divergence_table)."""
  final = {arm: [r["eval"][-1]["success"] for r in runs.values() if r["eval"]] for arm, runs in results.items()}
  start = {arm: [r["eval"][0]["success"] for r in runs.values() if r["eval"]] for arm, runs in results.items()}
  target = float(np.mean(final[baseline])) if final.get(baseline) else None
  lines = ["| arm | seeds | warm-start success | final success (mean ± s.e.) | updates to reach "
           f"{baseline}'s final |", "|---|---|---|---|---|"]
  for arm, runs in results.items():
    f, s = final[arm], start[arm]
    _, se = paired_stats.mean_se(f)
    reach = "-"
    curves = [r["eval"] for r in runs.values() if r["eval"]]
    if target is not None and curves:
      n = min(map(len, curves))
      m, _ = paired_stats.mean_se([[e["success"] for e in c[:n]] for c in curves])
      hit = [curves[0][i]["updates"] for i in range(n) if m[i] >= target - 1e-9]
      reach = str(hit[0]) if hit else "not reached"
    lines.append(f"| {arm} | {len(f)} | {np.mean(s):.3f} | {np.mean(f):.3f} ± {se:.3f} | {reach} |")
  tables = ["\n".join(lines), paired_table(results, baseline), divergence_table(results, baseline)]
  return "\n\n".join(t for t in tables if t) + "\n"


def _panel_outcomes(runs: dict[int, dict]) -> dict[tuple[str, float], dict[int, dict]]:
  """{(split, temperature): {seed: the final evaluation's outcomes}}, panels in evaluate's order."""
  out: dict[tuple[str, float], dict[int, dict]] = {}
  for seed, r in runs.items():
    for panel, solved in paired_stats.outcomes(r.get("episodes", ())).items():
      out.setdefault(panel, {})[seed] = solved
  return out


def _paired_row(arm: str, panel: tuple[str, float], mine: dict[int, dict], theirs: dict[int, dict]) -> str:
  rate = lambda side: {s: paired_stats.success_rate(v) for s, v in side.items()}
  diffs = paired_stats.paired_differences(rate(mine), rate(theirs))
  if not diffs:
    return ""
  m, se = paired_stats.mean_se(list(diffs.values()))
  t = paired_stats.mcnemar(paired_stats.pair_episodes(mine, theirs))
  per_seed = ", ".join(f"s{s} {d:+.3f}" for s, d in sorted(diffs.items()))
  return (f"| {arm} | {panel[0]} | {panel[1]:g} | {len(diffs)} | {per_seed} | {m:+.3f} ± {se:.3f} | {t.b} | {t.c} "
          f"| {t.p:.4g} |")


def paired_table(results: dict[str, dict[int, dict]], baseline: str) -> str:
  """Markdown: per arm and evaluation panel (split, temperature) at the final evaluation, the success
  difference to the baseline per seed (same seed: same keys), its mean ± s.e. over seeds, and McNemar's counts
  and exact p over the panel's episodes pooled over seeds. "" without episode dumps of another arm."""
  base = _panel_outcomes(results.get(baseline, {}))
  rows = [_paired_row(arm, panel, mine, base.get(panel, {})) for arm in results if arm != baseline
          for panel, mine in _panel_outcomes(results[arm]).items()]
  if not any(rows):
    return ""
  return "\n".join([f"Paired with {baseline} at the final evaluation (same seed = same keys). Δ = arm - {baseline} "
                    f"success; McNemar over the episodes pooled over seeds: b = arm solved and {baseline} not, c = "
                    "the reverse, p = exact two-sided binomial.", "",
                    "| arm | split | temperature | seeds | Δ per seed | Δ mean ± s.e. | b | c | McNemar p |",
                    "|---|---|---|---|---|---|---|---|---|"] + [r for r in rows if r])


def divergence_table(results: dict[str, dict[int, dict]], baseline: str) -> str:
  """Markdown: per seed and arm, the first update whose rollout fingerprint differs from the baseline's ("never":
  equal at every update both measured; "-": none measured). "" without another arm."""
  fps = lambda r: {e["updates"]: e.get("fingerprint") for e in r["train"]}
  base = results.get(baseline, {})
  rows = []
  for arm, runs in results.items():
    for seed in sorted(s for s in runs if s in base and arm != baseline):
      first, n = paired_stats.first_divergence(fps(runs[seed]), fps(base[seed]))
      rows.append(f"| {seed} | {arm} | {'-' if not n else 'never' if first is None else first} | {n} |")
  if not rows:
    return ""
  return "\n".join([f"Rollouts against {baseline}'s (rollout/fingerprint: same samples, same fingerprint).", "",
                    f"| seed | arm | first update differing from {baseline} | updates compared |", "|---|---|---|---|"]
                   + rows)


def gather(workdir: str, arms: Sequence[str], seeds: Sequence[int]) -> dict[str, dict[int, dict]]:
  results: dict[str, dict[int, dict]] = {}
  for arm in arms:
    for seed in seeds:
      rundir = os.path.join(workdir, f"{arm}-s{seed}")
      if os.path.exists(os.path.join(rundir, DONE_FILE)):
        curve = eval_curve(os.path.join(rundir, "metrics.jsonl"))
        results.setdefault(arm, {})[seed] = dict(eval=curve, train=train_curve(os.path.join(rundir, "metrics.jsonl")),
                                                 episodes=final_episodes(rundir, curve))
  return results


def write_outputs(workdir: str, arms: Sequence[str], seeds: Sequence[int]) -> dict[str, dict[int, dict]]:
  results = gather(workdir, arms, seeds)
  with open(os.path.join(workdir, "experiment.jsonl"), "w", encoding="utf-8") as f:
    for arm, runs in results.items():
      for seed, r in sorted(runs.items()):
        for e in r["eval"]:
          f.write(json.dumps(dict(arm=arm, seed=seed, kind="eval", **e)) + "\n")
        for e in r["train"]:
          f.write(json.dumps(dict(arm=arm, seed=seed, kind="train", **e)) + "\n")
  if results:
    plot(results, os.path.join(workdir, "curves.png"))
    with open(os.path.join(workdir, "summary.md"), "w", encoding="utf-8") as f:
      f.write(f"Machine: {machine.cpu_description()}\n\n" +
              summarize(results, "grpo" if "grpo" in results else next(iter(results))))
  return results


def run(cfg: ml_collections.ConfigDict, workdir: str, arms: Sequence[str], seeds: Sequence[int]) -> dict:
  """Every arm x seed not yet finished, then the outputs. Returns the gathered results."""
  from seed_jax import loop, warmstart
  os.makedirs(workdir, exist_ok=True)
  model_path = warmstart.ensure_warm_policy(cfg) if cfg.warmstart.before_rl else cfg.model.path
  for seed in seeds:
    for arm in arms:
      rundir = os.path.join(workdir, f"{arm}-s{seed}")
      if os.path.exists(os.path.join(rundir, DONE_FILE)):
        print(f"seed_jax.experiment: {arm} seed {seed} already finished")
        continue
      print(f"seed_jax.experiment: {arm} seed {seed} -> {rundir}")
      out = loop.train(run_config(cfg, arm, seed, model_path), rundir)
      if out["stopped"]:  # not finished: the next call resumes this run
        from seed_jax.infra.stop import exit_after_stop
        exit_after_stop(out, rundir)
      with open(os.path.join(rundir, DONE_FILE), "w") as f:
        json.dump({k: v for k, v in out["metrics"].items() if isinstance(v, (int, float))}, f, indent=2)
      write_outputs(workdir, arms, seeds)
  return write_outputs(workdir, arms, seeds)


def main(argv) -> None:
  del argv
  import logging
  from absl import flags
  if not flags.FLAGS["verbosity"].present:  # Orbax and JAX log every checkpoint step at INFO, as in main.py
    for name in ("absl", "jax"):
      logging.getLogger(name).setLevel(logging.WARNING)
  from seed_jax.config import validate
  cfg = _CONFIG.value
  try:
    arms, seeds = parse_arms(_ARMS.value), parse_seeds(_SEEDS.value)
    if _MODE.value not in ("race", "paired"):
      raise ValueError(f"--mode={_MODE.value!r} must be 'race' or 'paired'")
    validate(cfg)
  except ValueError as e:
    sys.exit(f"experiment error: {e}")
  from seed_jax import templates
  templates.use(cfg.templates)
  if cfg.compile_cache.enabled:  # every run after the first reads its compiled programs back
    from seed_jax.infra import compile_cache
    compile_cache.enable(cfg.compile_cache.dir, cfg.compile_cache.min_compile_time_s)
  workdir = _WORKDIR.value or os.path.join("runs", f"{cfg.env.name}-experiment")
  if _MODE.value == "paired":  # one update per arm from the same state, the teacher test (seed_jax/paired.py)
    from seed_jax import paired
    out = paired.run(cfg, workdir, _BATCHES.value, [float(w) for w in _WEIGHTS.value.split(",")])
    print(out["text"])
    return
  print(f"seed_jax.experiment: arms {arms}, seeds {seeds}, workdir {os.path.abspath(workdir)}")
  results = run(cfg, workdir, arms, seeds)
  if results:
    with open(os.path.join(workdir, "summary.md"), encoding="utf-8") as f:
      print(f.read())
    print(f"seed_jax.experiment: curves {os.path.join(workdir, 'curves.png')}")


if __name__ == "__main__":  # flags only here: main.py defines --config/--workdir too, and tests import both
  from absl import app, flags as _flags
  from ml_collections import config_flags
  _CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file[:variant]")
  _ARMS = _flags.DEFINE_string("arms", "seed,grpo", f"comma-separated arms: {', '.join(sorted(ARMS))}")
  _SEEDS = _flags.DEFINE_string("seeds", "0,1,2", "comma-separated seeds")
  _WORKDIR = _flags.DEFINE_string("workdir", "", "experiment folder (default runs/<env>-experiment)")
  _MODE = _flags.DEFINE_string("mode", "race", "'race': arms x seeds of whole runs; 'paired': one update per arm "
                               "from the same state on the same batch, then the probe (seed_jax/paired.py)")
  _BATCHES = _flags.DEFINE_integer("batches", 3, "paired mode: batches (one rollout each)")
  _WEIGHTS = _flags.DEFINE_string("weights", "1.0,0.01", "paired mode: OPD weights, the first for every skill source")
  app.run(main)
