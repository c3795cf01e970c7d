"""Reporting: an update's metrics, its one log line, the dumped trajectories, and at the end of a run a
summary table (one row per update) and `curves.png` of the run's metrics."""
from __future__ import annotations

import hashlib
import math
import os
from typing import Any, Sequence

import numpy as np

from seed_jax import batch as batch_lib
from seed_jax import records, shares
from seed_jax.buckets import TokenCount
from seed_jax.envs.base import Trajectory
from seed_jax.runtime import Runtime

CURVES_FILE = "curves.png"
PHASES = ("rollout", "analysis", "rescore", "update")
# The summary table's per-update columns: (header, metric, format).
COLUMNS = (("success", "rollout/success", "{:.3f}"), ("invalid", "rollout/invalid_action_rate", "{:.2f}"),
           ("|A|", "advantages/abs_mean", "{:.3f}"), ("parse", "analysis/parse_rate", "{:.2f}"),
           ("opd-tokens", "update/opd_tokens", "{:.0f}")) + tuple(
               (f"{p} s", f"time/{p}_s", "{:.1f}") for p in PHASES)


def fingerprint(trajs: Sequence[Trajectory]) -> int:
  """A 32-bit hash of the episodes' sampled tokens, in episode order: two runs' rollouts of an update are the
  same samples exactly when their fingerprints agree (arms share every key, so they diverge only once their
  weights do)."""
  h = hashlib.sha256()
  for t in sorted(trajs, key=lambda t: (t.group_id, t.traj_id)):
    h.update(f"{t.task.task_id}|{t.group_id}|{t.traj_id}|".encode())
    for s in t.steps:
      h.update(np.asarray(s.response_tokens, np.int64).tobytes() + b"|")
  return int(h.hexdigest()[:8], 16)


def rollout_metrics(trajs: Sequence[Trajectory], prefix: str) -> dict[str, float]:
  good = [t for t in trajs if t.termination != "env_error"]
  steps = [s for t in good for s in t.steps]
  m = {f"{prefix}/episodes": len(trajs), f"{prefix}/env_errors": len(trajs) - len(good)}
  if good:
    m.update({f"{prefix}/return": float(np.mean([t.episode_return for t in good])),
              f"{prefix}/success": float(np.mean([t.success for t in good])),
              f"{prefix}/score": float(np.mean([t.score for t in good])),
              f"{prefix}/episode_length": float(np.mean([t.length for t in good])),
              f"{prefix}/invalid_action_rate": float(np.mean([not s.action_valid for s in steps])) if steps else 0.0,
              f"{prefix}/truncated_prompts": float(sum(t.truncated_prompts for t in good)),
              f"{prefix}/response_tokens": float(np.mean([len(s.response_tokens) for s in steps])) if steps else 0.0})
    for term in ("done", "max_steps", "context_overflow"):
      m[f"{prefix}/term_{term}"] = float(np.mean([t.termination == term for t in good]))
  return m


def update_report(rt: Runtime, trajs: Sequence[Trajectory], samples: batch_lib.Samples, times: dict[str, float],
                  tokens: dict[str, TokenCount]) -> dict[str, float]:
  """`trajs` and `tokens` are every process's, `samples` this process's, `times` its own. The update's remaining
  metrics: OPD coverage, phase timings, sampling throughput, compiles, env restarts,
  and per phase the token positions computed against the real ones (tokens/<phase>_forwarded, _real; 0 for a
  phase that did not run)."""
  opd_N = shares.gather_concat(samples.opd_mask_N)
  m = {"opd/analyzed_row_frac": float(opd_N.mean()) if opd_N.size else 0.0}
  m.update(times)
  gen_tokens = sum(len(s.response_tokens) for t in trajs for s in t.steps)
  m["rollout/tokens_per_s"] = gen_tokens / max(times.get("time/rollout_s", 0.0), 1e-9)
  m["compiles/sampler"], m["compiles/rescore"] = rt.sampler.compiles.count, rt.rescorer.compiles.count
  m["compiles/update"] = rt.update_compiles.count
  for phase in PHASES:
    m.update(tokens.get(phase, TokenCount()).metrics(f"tokens/{phase}"))
  return m


def summary_line(u: int, total: int, m: dict[str, Any]) -> str:
  """One log line per update: the outcome, the distillation signal and where the time went."""
  get = lambda k: m.get(k) if isinstance(m.get(k), (int, float)) else float("nan")
  times = " ".join(f"{k[5:-2]} {get(k):.0f}s" for k in ("time/rollout_s", "time/analysis_s", "time/rescore_s",
                                                          "time/update_s") if k in m)
  return (f"update {u + 1}/{total}: return {get('rollout/return'):.3f} success {get('rollout/success'):.3f} "
          f"invalid {get('rollout/invalid_action_rate'):.2f} |A| {get('advantages/abs_mean'):.3f} "
          f"skill-parse {get('analysis/parse_rate'):.2f} opd-tokens {get('update/opd_tokens'):.0f} "
          f"loss {get('update/loss'):.4f} | {times}")


def traj_record(t: Trajectory) -> dict:
  return dict(task=t.task.to_json(), group=t.group_id, traj=t.traj_id, ret=t.episode_return, success=t.success,
              termination=t.termination, steps=[dict(observation=s.observation, response=s.response_text,
                                                     action=s.action, valid=s.action_valid, reward=s.reward)
                                                for s in t.steps])


def split_records(rows: Sequence[dict]) -> tuple[list[dict], list[dict]]:
  """A run's metrics records as (updates, evaluations), each in step order (the last copy of a step wins)."""
  updates = {r["step"]: r for r in rows if "eval/updates_done" not in r}
  evals = {r["step"]: r for r in rows if "eval/updates_done" in r}
  return [updates[k] for k in sorted(updates)], [evals[k] for k in sorted(evals)]


def _eval_splits(evals: Sequence[dict]) -> list[str]:
  return list(dict.fromkeys(k.split("/")[1] for r in evals for k in r
                            if k.startswith("eval/") and k.endswith("/success") and k.count("/") == 2))


def _num(r: dict | None, key: str) -> float:
  v = (r or {}).get(key)
  return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def summary_table(updates: Sequence[dict], evals: Sequence[dict] = ()) -> str:
  """One row per update (by updates done; 0 holds only an evaluation of the starting weights): rollout
  success, invalid-action rate, mean |advantage|, skill-parse rate, OPD tokens, phase seconds, and the
  evaluation success per split where one was taken after that many updates. "-": not measured."""
  splits = _eval_splits(evals)
  by_done = {int(r["eval/updates_done"]): r for r in evals}
  by_update = {int(r["step"]) + 1: r for r in updates}
  header = ["update"] + [c[0] for c in COLUMNS] + [f"eval {s}" for s in splits]
  cell = lambda v, fmt: "-" if math.isnan(v) else fmt.format(v)
  lines = []
  for done in sorted(set(by_update) | set(by_done)):
    u, e = by_update.get(done), by_done.get(done)
    lines.append([str(done)] + [cell(_num(u, k), fmt) for _, k, fmt in COLUMNS]
                 + [cell(_num(e, f"eval/{s}/success"), "{:.3f}") for s in splits])
  widths = [max(len(row[i]) for row in [header] + lines) for i in range(len(header))]
  fmt = lambda row: "  ".join(c.rjust(w) for c, w in zip(row, widths))
  return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(row) for row in lines])


def plot_curves(updates: Sequence[dict], evals: Sequence[dict], path: str) -> None:
  """Success (rollout and evaluations), invalid actions, |A|, skill parsing, OPD tokens and phase times
  against updates done, as one PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  x = [int(r["step"]) + 1 for r in updates]
  series = lambda key: [_num(r, key) for r in updates]
  fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
  ax = axes[0, 0]
  ax.plot(x, series("rollout/success"), "o-", label="rollout")
  for s in _eval_splits(evals):
    ax.plot([int(r["eval/updates_done"]) for r in evals], [_num(r, f"eval/{s}/success") for r in evals], "s--",
            label=f"eval {s}")
  ax.set_title("success")
  for ax, key, title in ((axes[0, 1], "rollout/invalid_action_rate", "invalid-action rate"),
                         (axes[0, 2], "advantages/abs_mean", "mean |advantage|"),
                         (axes[1, 0], "analysis/parse_rate", "skill-parse rate"),
                         (axes[1, 1], "update/opd_tokens", "OPD tokens per optimizer step")):
    ax.plot(x, series(key), "o-")
    ax.set_title(title)
  ax = axes[1, 2]
  for p in PHASES:
    if any(f"time/{p}_s" in r for r in updates):
      ax.plot(x, series(f"time/{p}_s"), "o-", label=p)
  ax.set_title("phase seconds")
  save_figure(fig, axes.ravel(), path, "updates done")


def save_figure(fig, axes, path: str, xlabel: str, dpi: int = 100) -> None:
  """Integer update ticks, a light grid and a legend where a panel has labels on every axis, then the PNG."""
  import matplotlib.pyplot as plt
  from matplotlib.ticker import MaxNLocator
  for ax in axes:
    ax.set_xlabel(xlabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  plt.close(fig)


def run_summary(metrics_path: str, workdir: str) -> str:
  """The summary table of a run's metrics file; writes its curves to <workdir>/curves.png."""
  updates, evals = split_records(records.read_records(metrics_path))
  plot_curves(updates, evals, os.path.join(workdir, CURVES_FILE))
  return summary_table(updates, evals)
