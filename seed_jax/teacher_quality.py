"""Is the skill a good teacher? Where the env has gold paths, every step-sample with a skill gets one row:

- `gap`: the skill-induced shift of its sampled response, the mean per token of log π(y | H(h, s)) − log π(y | h)
  (the quantity the OPD gate and loss read);
- `on_gold`: 1 where the trajectory was on the gold path up to this step and the sampled action is the gold one,
  0 where this step is its first divergence from the gold path, -1 after it (no gold action is known there);
- `gold_gain` (states on the gold path only, where the gold reply fits in rollout.max_new_tokens): the gold reply
  teacher-forced under the skill minus without it, in nats over the whole reply.

A good teacher raises the gold action (gold_gain > 0) and separates on-gold from off-gold samples (`auc`: the
probability that an on-gold sample's gap exceeds an off-gold one's). `metrics` reduces one update's rows;
`clustered_mean` and `paired_by_state` are the statistics of the teacher test (seed_jax.paired), where rows of
one state (the same task and step on its gold path) are not independent.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np

from seed_jax import batch as batch_lib
from seed_jax import sft, sft_oracle
from seed_jax.envs.base import Trajectory

Z95 = 1.959964


def gold_labels(traj: Trajectory, gold: Sequence[str] | None) -> list[int]:
  """Per step: 1 on the gold path, 0 at the first divergence, -1 after it or without a gold path."""
  if not gold:
    return [-1] * traj.length
  k = sft_oracle.first_divergence(traj, gold)
  return [1 if j < k else 0 if j == k and j < len(gold) else -1 for j in range(traj.length)]


def gold_reply(action: str, cfg) -> str:
  from seed_jax.warmstart import demo_response  # the reply form the warm start teaches
  return demo_response(action, cfg.warmstart.reasoning, cfg.env.get("answer_format", "tags"))


def sample_rows(rt, params, trajs: Sequence[Trajectory], samples: batch_lib.Samples, old_logp: Sequence[np.ndarray],
                skill_logp: Sequence[np.ndarray] | None, u: int = 0) -> list[dict[str, Any]]:
  """One row per step-sample with a skill (samples.opd_mask_N), over this process's trajectories. `skill_logp`
  None: the skill context is scored here (the update's teacher is π_θ, so the re-score did not). Collective
  with several processes: every process calls it at the same point."""
  cfg, T = rt.cfg, rt.cfg.rollout.temperature
  golds = rt.gold_paths([t.task for t in trajs])
  idx = [i for i in range(len(samples)) if samples.opd_mask_N[i]]
  if skill_logp is None and (idx or jax.process_count() > 1):
    scored = rt.rescorer.score(params, [[samples.skill_prompts[i] for i in idx]],
                               [samples.responses[i] for i in idx], T, images=_pick(samples.images, idx))[0][0]
    skill_logp = dict(zip(idx, scored))
  step_of = np.zeros(len(samples), np.int64)  # samples are laid out trajectory by trajectory, step by step
  for i in range(1, len(samples)):
    same = samples.traj_index_N[i] == samples.traj_index_N[i - 1]
    step_of[i] = step_of[i - 1] + 1 if same else 0
  labels = [gold_labels(t, g) for t, g in zip(trajs, golds)]
  rows, gold_idx, gold_resp = [], [], []
  for i in idx:
    k, j = int(samples.traj_index_N[i]), int(step_of[i])
    traj, gold, label = trajs[k], golds[k], labels[k][j]
    gap = np.asarray(skill_logp[i], np.float64) - np.asarray(old_logp[i], np.float64)
    rows.append(dict(u=u, task=traj.task.task_id, group=traj.group_id, traj=traj.traj_id, step=j,
                     success=bool(traj.success), on_gold=label, gap=float(gap.mean()) if gap.size else 0.0,
                     gold_gain=None, state=f"{u}|{traj.task.task_id}|{j}" if label >= 0 else None))
    reply = rt.tokenizer.encode(gold_reply(gold[j], cfg)) + [sft.end_of_turn_id(rt.tokenizer)] if label >= 0 else []
    if reply and len(reply) <= cfg.rollout.max_new_tokens:  # a longer reply is one the rollout never samples
      gold_idx.append((len(rows) - 1, i))
      gold_resp.append(reply)
  ids = [i for _, i in gold_idx]
  if not ids and jax.process_count() == 1:
    return rows
  lp = rt.rescorer.score(params, [[samples.prompts[i] for i in ids], [samples.skill_prompts[i] for i in ids]],
                         gold_resp, T, images=_pick(samples.images, ids))[0]
  for n, (r, _) in enumerate(gold_idx):
    rows[r]["gold_gain"] = float(np.sum(lp[1][n], dtype=np.float64) - np.sum(lp[0][n], dtype=np.float64))
  return rows


def _pick(images, idx):
  return None if images is None else [images[i] for i in idx]


def auc(pos: Sequence[float], neg: Sequence[float]) -> float:
  """P(a positive's score > a negative's), ties counted half (the Mann-Whitney U over n_pos * n_neg); NaN when a
  side is empty."""
  pos, neg = np.asarray(pos, np.float64), np.asarray(neg, np.float64)
  if not pos.size or not neg.size:
    return math.nan
  greater = (pos[:, None] > neg[None, :]).sum()
  ties = (pos[:, None] == neg[None, :]).sum()
  return float((greater + 0.5 * ties) / (pos.size * neg.size))


def _mean(xs) -> float:
  return float(np.mean(xs)) if len(xs) else math.nan


def metrics(rows: Sequence[dict[str, Any]], prefix: str = "teacher") -> dict[str, float]:
  on = [r["gap"] for r in rows if r["on_gold"] == 1]
  off = [r["gap"] for r in rows if r["on_gold"] == 0]
  gains = [r["gold_gain"] for r in rows if r["gold_gain"] is not None]
  return {f"{prefix}/rows": float(len(rows)), f"{prefix}/on_gold": float(len(on)), f"{prefix}/off_gold": float(len(off)),
          f"{prefix}/gap_success": _mean([r["gap"] for r in rows if r["success"]]),
          f"{prefix}/gap_failure": _mean([r["gap"] for r in rows if not r["success"]]),
          f"{prefix}/gap_on_gold": _mean(on), f"{prefix}/gap_off_gold": _mean(off), f"{prefix}/auc": auc(on, off),
          f"{prefix}/gold_gain": _mean(gains)}


def clustered_mean(values: Sequence[float], clusters: Sequence[Any]) -> tuple[float, float, float]:
  """(mean, 95 % CI low, high) of `values`, the s.e. clustered: rows of one cluster may be correlated, so the
  variance is that of the clusters' sums of deviations (the sandwich estimator, with the G / (G - 1) factor)."""
  x = np.asarray(values, np.float64)
  if not x.size:
    return math.nan, math.nan, math.nan
  mean = float(x.mean())
  sums: dict[Any, float] = {}
  for v, c in zip(x, clusters):
    sums[c] = sums.get(c, 0.0) + (v - mean)
  g = len(sums)
  if g < 2:
    return mean, math.nan, math.nan
  se = math.sqrt(g / (g - 1) * sum(s * s for s in sums.values())) / x.size
  return mean, mean - Z95 * se, mean + Z95 * se


def paired_by_state(rows: Sequence[dict[str, Any]], control: Sequence[dict[str, Any]]) -> tuple[float, float, float, int]:
  """The gold-action gain of `rows` minus its control's on the same states: per state the difference of the two
  mean gains, then the mean over states and its 95 % CI (states as the independent units). Returns
  (mean, low, high, states)."""
  def by_state(rs):
    out: dict[str, list[float]] = {}
    for r in rs:
      if r["gold_gain"] is not None:
        out.setdefault(r["state"], []).append(r["gold_gain"])
    return {s: float(np.mean(v)) for s, v in out.items()}
  a, b = by_state(rows), by_state(control)
  diffs = [a[s] - b[s] for s in sorted(a.keys() & b.keys())]
  mean, lo, hi = clustered_mean(diffs, range(len(diffs)))
  return mean, lo, hi, len(diffs)
