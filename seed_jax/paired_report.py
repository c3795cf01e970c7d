"""The paired one-update test's files, tables and figure (seed_jax.paired writes the rows): the warm start as the
batches saw it, the teacher test (per skill source, read against its shuffled control), and the paired test
(each arm's probe gain against GRPO's on the same batch)."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

import numpy as np

from seed_jax import records, report, teacher_quality

ARMS_FILE, TEACHER_FILE, REPORT_FILE, FIGURE_FILE = "paired.jsonl", "teacher.jsonl", "paired.md", "paired.png"
# Skill source -> (analyzer.backend, analyzer.control), and each source's control in the same wording.
SOURCES = {"oracle": ("oracle", "none"), "oracle-shuffled": ("oracle", "shuffled"),
           "policy": ("policy", "none"), "policy-shuffled": ("policy", "shuffled")}
CONTROL = {"oracle": "oracle-shuffled", "policy": "policy-shuffled"}


def _f(x: Any, fmt: str = "{:.3f}") -> str:
  return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _ci(mean: float, lo: float, hi: float, fmt: str = "{:+.3f}") -> str:
  return f"{_f(mean, fmt)} [{_f(lo, fmt)}, {_f(hi, fmt)}]"


def source_summary(rows: Sequence[dict]) -> dict[str, Any]:
  """One skill source's teacher rows pooled over batches."""
  m = teacher_quality.metrics(rows, "t")
  gains = [(r["gold_gain"], r["state"]) for r in rows if r["gold_gain"] is not None]
  mean, lo, hi = teacher_quality.clustered_mean([g for g, _ in gains], [s for _, s in gains])
  episodes = len({(r["u"], r["group"], r["traj"]) for r in rows})
  return dict(episodes=episodes, rows=len(rows), on=int(m["t/on_gold"]), off=int(m["t/off_gold"]),
              gap_success=m["t/gap_success"], gap_failure=m["t/gap_failure"], gap_on=m["t/gap_on_gold"],
              gap_off=m["t/gap_off_gold"], auc=m["t/auc"], gain=(mean, lo, hi), states=len({s for _, s in gains}))


def teacher_table(trows: Sequence[dict]) -> tuple[str, dict[str, Any]]:
  by = {s: [r for r in trows if r["source"] == s] for s in SOURCES}
  sums = {s: source_summary(rs) for s, rs in by.items()}
  lines = ["| skills | episodes with a skill | samples (on-gold / off-gold) | Δ success | Δ failure | Δ on-gold | "
           "Δ off-gold | AUC | gold-reply gain, nats [95 % CI, by state] |", "|---|---|---|---|---|---|---|---|---|"]
  for s, v in sums.items():
    lines.append(f"| {s} | {v['episodes']} | {v['rows']} ({v['on']} / {v['off']}) | {_f(v['gap_success'], '{:+.4f}')} | "
                 f"{_f(v['gap_failure'], '{:+.4f}')} | {_f(v['gap_on'], '{:+.4f}')} | {_f(v['gap_off'], '{:+.4f}')} | "
                 f"{_f(v['auc'])} | {_ci(*v['gain'])} |")
  lines += ["", "| skills vs their control (same wording, another task's skill) | AUC − control's | gold-reply gain − "
            "control's, nats [95 % CI over states] | states |", "|---|---|---|---|"]
  contrasts = {}
  for s, ctl in CONTROL.items():
    mean, lo, hi, n = teacher_quality.paired_by_state(by[s], by[ctl])
    d_auc = sums[s]["auc"] - sums[ctl]["auc"]
    contrasts[s] = dict(auc_diff=d_auc, gain_diff=(mean, lo, hi), states=n)
    lines.append(f"| {s} | {_f(d_auc, '{:+.3f}')} | {_ci(mean, lo, hi)} | {n} |")
  return "\n".join(lines) + "\n", dict(sources=sums, contrasts=contrasts)


def paired_table(rows: Sequence[dict]) -> tuple[str, dict[str, Any]]:
  batches = sorted({r["batch"] for r in rows})
  names = list(dict.fromkeys(r["arm"] for r in rows))
  get = {(r["arm"], r["batch"]): r for r in rows}
  out: dict[str, Any] = {}
  for a in names:
    rs = [get[(a, b)] for b in batches if (a, b) in get]
    margins = np.asarray([r["margin"] for r in rs])
    se = float(margins.std(ddof=1) / np.sqrt(len(margins))) if len(margins) > 1 else math.nan
    out[a] = dict(gains=[r["probe_gain"] for r in rs], margins=margins.tolist(), mean_margin=float(margins.mean()),
                  se=se, wins=int((margins > 0).sum()), n=len(rs), kl=float(np.mean([r["kl"] for r in rs])),
                  delta=float(np.mean([r["param_delta"] for r in rs])), opd_tokens=float(np.mean([r["opd_tokens"] for r in rs])))
  for a, v in out.items():  # the margin against the same-weight shuffled control's
    ctl = a.replace("-oracle-", "-oracle-shuffled-") if "-oracle-w" in a else None
    v["control_ratio"] = (v["mean_margin"] / abs(out[ctl]["mean_margin"]) if ctl in out and out[ctl]["mean_margin"]
                          else None)
  lines = ["| arm | probe gain per batch (nats) | margin over GRPO per batch | mean margin ± s.e. | batches won | "
           "margin / |shuffled margin| | KL(before‖after) | ‖Δθ‖ | OPD tokens |", "|---|---|---|---|---|---|---|---|---|"]
  for a, v in out.items():
    lines.append(f"| {a} | {', '.join(f'{g:+.4f}' for g in v['gains'])} | {', '.join(f'{m:+.4f}' for m in v['margins'])} "
                 f"| {v['mean_margin']:+.4f} ± {_f(v['se'], '{:.4f}')} | {v['wins']}/{v['n']} | "
                 f"{_f(v['control_ratio'], '{:.1f}')} | {v['kl']:.5f} | {v['delta']:.4f} | {v['opd_tokens']:.0f} |")
  return "\n".join(lines) + "\n", out


def warm_table(rows: Sequence[dict], trows: Sequence[dict]) -> str:
  """The warm-started policy as the batches met it: rollouts at the training temperature and its self-analysis."""
  grpo = [r for r in rows if r["arm"] == "grpo"]
  lines = ["| batch | episodes | rollout success | invalid-action rate | policy parse rate: successes | failures | "
           "fingerprint |", "|---|---|---|---|---|---|---|"]
  for r in grpo:
    lines.append(f"| {r['batch']} | {r['episodes']} | {_f(r['rollout_success'])} | {_f(r['rollout_invalid'])} | "
                 f"{_f(r.get('parse_success/policy'))} | {_f(r.get('parse_failure/policy'))} | {r['fingerprint']:08x} |")
  return "\n".join(lines) + "\n"


def plot(teacher: dict[str, Any], paired: dict[str, Any], path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
  srcs = list(teacher["sources"])
  ax = axes[0]
  ax.bar(range(len(srcs)), [teacher["sources"][s]["auc"] for s in srcs], color="tab:blue")
  ax.axhline(0.5, color="gray", linewidth=0.8)
  ax.set_xticks(range(len(srcs)), srcs, rotation=20)
  ax.set_title("on-gold vs off-gold AUC of the skill gap Δ")
  ax = axes[1]
  for i, s in enumerate(srcs):
    m, lo, hi = teacher["sources"][s]["gain"]
    ax.errorbar([i], [m], yerr=[[m - lo], [hi - m]] if not math.isnan(lo) else None, fmt="o", color="tab:green")
  ax.axhline(0.0, color="gray", linewidth=0.8)
  ax.set_xticks(range(len(srcs)), srcs, rotation=20)
  ax.set_title("gold reply: log p(· | skill) − log p(·), nats (95 % CI)")
  ax = axes[2]
  names = list(paired)
  for i, a in enumerate(names):
    ms = paired[a]["margins"]
    ax.scatter([i] * len(ms), ms, color="tab:orange", s=18)
    ax.plot([i - 0.3, i + 0.3], [np.mean(ms)] * 2, color="black")
  ax.axhline(0.0, color="gray", linewidth=0.8)
  ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
  ax.set_title("probe: gold-reply gain minus GRPO's, per batch (nats)")
  report.save_figure(fig, [], path, None, dpi=110)


def write(workdir: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  rows = records.read_records(os.path.join(workdir, ARMS_FILE))
  trows = records.read_records(os.path.join(workdir, TEACHER_FILE))
  ttext, teacher = teacher_table(trows)
  ptext, paired = paired_table(rows)
  head = "".join(f"- {k}: {v}\n" for k, v in (extra or {}).items())
  text = (f"# Paired one-update test\n\n{head}\n## Warm start\n\n{warm_table(rows, trows)}\n## Teacher test\n\n{ttext}\n"
          f"## Paired test\n\n{ptext}")
  with open(os.path.join(workdir, REPORT_FILE), "w", encoding="utf-8") as f:
    f.write(text)
  plot(teacher, paired, os.path.join(workdir, FIGURE_FILE))
  with open(os.path.join(workdir, "paired_summary.json"), "w", encoding="utf-8") as f:
    json.dump(dict(teacher=teacher, paired=paired), f, indent=2, default=float)
  return dict(teacher=teacher, paired=paired, text=text)
