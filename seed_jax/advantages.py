"""SEED's advantages, on the host in numpy (observations are text, so grouping runs in numpy/Python).

  penalized_scores → grpo_step_advantages | grpo_trajectory_advantages, optionally + ω·GiGPO step advantages;
  `compute_advantages(StepSamples, cfg)` assembles them from config.objectives. The per-token losses that
  consume them are in seed_jax.losses.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Sequence

import ml_collections
import numpy as np

from seed_jax.config import check_choice
from seed_jax.envs.base import Trajectory

EPS = 1e-6  # A = (s − μ)/(σ + EPS), as in verl's GRPO


@dataclasses.dataclass
class StepSamples:
  """Per step-sample columns (N samples) that advantages are computed from.

  `traj_ids_N` need only be unique within a group; `step_idx_N` runs 0..len−1 inside each trajectory.
  """
  group_ids_N: np.ndarray
  traj_ids_N: np.ndarray
  step_idx_N: np.ndarray
  returns_N: np.ndarray  # R(τ) of the sample's trajectory
  rewards_N: np.ndarray  # env reward of this step (GiGPO step returns)
  invalid_N: np.ndarray  # bool: the action did not parse
  observations: list[str]  # raw observation the step's prompt was built from (GiGPO anchor)

  @classmethod
  def from_trajectories(cls, trajs: Sequence[Trajectory]) -> "StepSamples":
    """Flattens trajectories (in order, steps in order); the caller drops env-error episodes first."""
    rows = [(t.group_id, t.traj_id, i, t.episode_return, s.reward, not s.action_valid, s.observation)
            for t in trajs for i, s in enumerate(t.steps)]
    g, k, i, ret, rew, inv, obs = zip(*rows) if rows else ((),) * 7
    return cls(np.asarray(g), np.asarray(k), np.asarray(i, np.int64), np.asarray(ret, np.float64),
               np.asarray(rew, np.float64), np.asarray(inv, bool), list(obs))


def _index(*keys_N: np.ndarray) -> tuple[np.ndarray, int]:
  """Dense ids 0..G−1 for the distinct key tuples, and G."""
  if len(keys_N[0]) == 0:
    return np.zeros(0, np.int64), 0
  cols = [np.unique(np.asarray(k), return_inverse=True)[1].reshape(-1) for k in keys_N]
  _, inv = np.unique(np.stack(cols, 1), axis=0, return_inverse=True)
  inv = inv.reshape(-1)
  return inv, int(inv.max()) + 1


def _group_stats(x_M: np.ndarray, idx_M: np.ndarray, n: int, ddof: int):
  """Per-group mean, std (ddof 1: unbiased, 0: population) and count; groups indexed 0..n−1."""
  cnt_G = np.bincount(idx_M, minlength=n).astype(np.float64)
  mu_G = np.bincount(idx_M, x_M, n) / np.maximum(cnt_G, 1)
  ss_G = np.bincount(idx_M, (x_M - mu_G[idx_M]) ** 2, n)
  sd_G = np.sqrt(ss_G / np.maximum(cnt_G - ddof, 1))
  return mu_G, sd_G, cnt_G


def _normalize(x_N, mu_N, sd_N, mode: str) -> np.ndarray:
  """mean_std_norm: (x − μ)/(σ + 1e-6); mean_norm: x − μ."""
  check_choice("objectives.norm_mode", mode)
  return (x_N - mu_N) / (sd_N + EPS) if mode == "mean_std_norm" else x_N - mu_N


def _grpo(scores_N, g_N, stat_M, stat_g_M, n: int, ddof: int, mode: str) -> np.ndarray:
  """A_i = (s_i − μ_g)/(σ_g + 1e-6) (or s_i − μ_g), with μ_g, σ_g over the entries of `stat_M` in group g;
  a group with a single entry has μ=0, σ=1 (verl's GRPO rule)."""
  mu_G, sd_G, cnt_G = _group_stats(stat_M, stat_g_M, n, ddof)
  single_G = cnt_G == 1
  mu_G[single_G], sd_G[single_G] = 0.0, 1.0
  return _normalize(scores_N, mu_G[g_N], sd_G[g_N], mode)


def _same_length(**columns) -> None:
  lengths = {k: len(v) for k, v in columns.items()}
  if len(set(lengths.values())) > 1:
    raise ValueError(f"per-sample columns differ in length: {lengths}")


def penalized_scores(returns_N: np.ndarray, invalid_N: np.ndarray, penalty: float) -> np.ndarray:
  """Score of each step-sample: s = R(τ) − c_inv·[step invalid]."""
  return np.asarray(returns_N, np.float64) - penalty * np.asarray(invalid_N, np.float64)


def grpo_step_advantages(scores_N: np.ndarray, group_ids_N: np.ndarray, mode: str) -> np.ndarray:
  """GRPO over step-samples (reference code): A_i = (s_i − μ_g)/(σ_g + 1e-6) with μ_g and the *unbiased* σ_g
  over all step-samples of group g (long episodes weigh more); a group of one sample has μ=0, σ=1."""
  _same_length(scores_N=scores_N, group_ids_N=group_ids_N)
  scores_N = np.asarray(scores_N, np.float64)
  g_N, n = _index(group_ids_N)
  return _grpo(scores_N, g_N, scores_N, g_N, n, 1, mode)


def grpo_trajectory_advantages(scores_N: np.ndarray, returns_N: np.ndarray, group_ids_N: np.ndarray,
                               traj_ids_N: np.ndarray, mode: str) -> np.ndarray:
  """Paper's GRPO: μ_g and *population* σ_g over the returns R(τ) of group g's trajectories (each counted once),
  then A_i = (s_i − μ_g)/(σ_g + 1e-6) on every step-sample of τ (s_i = R(τ) unless penalized).
  A group of one trajectory has μ=0, σ=1."""
  _same_length(scores_N=scores_N, returns_N=returns_N, group_ids_N=group_ids_N, traj_ids_N=traj_ids_N)
  scores_N, returns_N = np.asarray(scores_N, np.float64), np.asarray(returns_N, np.float64)
  g_N, n = _index(group_ids_N)
  t_N, k = _index(group_ids_N, traj_ids_N)
  first_K = np.zeros(k, np.int64)
  first_K[t_N[::-1]] = np.arange(len(t_N))[::-1]  # first sample of each trajectory
  ret_K = returns_N[first_K]
  if not np.array_equal(ret_K[t_N], returns_N):
    raise ValueError("returns_N must be constant within each trajectory (it is R(τ) of the sample's trajectory)")
  return _grpo(scores_N, g_N, ret_K, g_N[first_K], n, 0, mode)


def discounted_returns(rewards_N: np.ndarray, group_ids_N: np.ndarray, traj_ids_N: np.ndarray,
                       step_idx_N: np.ndarray, gamma: float) -> np.ndarray:
  """GiGPO step return G_t = Σ_{k≥t} γ^{k−t} r_k inside each trajectory (verl-agent
  compute_step_discounted_returns). Steps of a trajectory must be numbered 0..len−1 exactly once."""
  _same_length(rewards_N=rewards_N, group_ids_N=group_ids_N, traj_ids_N=traj_ids_N, step_idx_N=step_idx_N)
  rewards_N, step_N = np.asarray(rewards_N, np.float64), np.asarray(step_idx_N, np.int64)
  t_N, k = _index(group_ids_N, traj_ids_N)
  if len(t_N) == 0:
    return np.zeros(0)
  len_K = np.bincount(t_N, minlength=k)
  if step_N.min() < 0 or np.any(step_N >= len_K[t_N]) or _index(t_N, step_N)[1] != len(t_N):
    raise ValueError("step_idx_N must number the steps of each trajectory 0..len-1, each exactly once")
  r_KS = np.zeros((k, int(len_K.max()) + 1))
  r_KS[t_N, step_N] = rewards_N
  for s in range(r_KS.shape[1] - 2, -1, -1):  # column S is the zero "after the end"
    r_KS[:, s] += gamma * r_KS[:, s + 1]
  return r_KS[t_N, step_N]


def anchor_groups(observations: Sequence[str], group_ids_N: np.ndarray, similarity: float) -> np.ndarray:
  """GiGPO anchor-state groups: step-samples of one task group whose raw observations are identical
  (similarity ≥ 1) or, for similarity < 1, greedily clustered by difflib ratio ≥ similarity against each
  cluster's first observation (verl-agent build_step_group). Returns dense group ids [N]."""
  if not 0.0 < similarity <= 1.0:
    raise ValueError(f"similarity={similarity} must be in (0, 1]")
  _same_length(observations=observations, group_ids_N=group_ids_N)
  g_N, _ = _index(np.asarray(group_ids_N))
  anchor_N = np.zeros(len(g_N), np.int64)
  reps: dict[int, list[tuple[str, int]]] = {}  # task group → [(cluster's first obs, anchor id)]
  seen: dict[tuple[int, str], int] = {}  # (task group, obs) → anchor id; exact repeats skip the similarity scan
  n_anchors = 0
  for i, (g, obs) in enumerate(zip(g_N.tolist(), observations)):
    aid = seen.get((g, obs))
    if aid is None and similarity < 1.0:
      aid = next((a for rep, a in reps.get(g, []) if difflib.SequenceMatcher(None, obs, rep).ratio() >= similarity),
                 None)
    if aid is None:
      aid, n_anchors = n_anchors, n_anchors + 1
      reps.setdefault(g, []).append((obs, aid))
    seen[(g, obs)] = aid
    anchor_N[i] = aid
  return anchor_N


def gigpo_step_advantages(step_returns_N: np.ndarray, anchor_N: np.ndarray, mode: str) -> np.ndarray:
  """GiGPO A^S: normalize the discounted step returns within each anchor-state group (unbiased σ);
  a singleton anchor group gets 0."""
  _same_length(step_returns_N=step_returns_N, anchor_N=anchor_N)
  x_N = np.asarray(step_returns_N, np.float64)
  a_N, n = _index(anchor_N)
  mu_G, sd_G, cnt_G = _group_stats(x_N, a_N, n, ddof=1)
  return np.where(cnt_G[a_N] > 1, _normalize(x_N, mu_G[a_N], sd_G[a_N], mode), 0.0)


def compute_advantages(s: StepSamples, cfg: ml_collections.ConfigDict) -> np.ndarray:
  """Per step-sample advantage [N] from config.objectives: GRPO A^E (+ ω·A^S for GiGPO)."""
  check_choice("objectives.adv_estimator", cfg.adv_estimator)
  check_choice("objectives.grpo_stats", cfg.grpo_stats)
  scores_N = penalized_scores(s.returns_N, s.invalid_N, cfg.invalid_penalty)
  if cfg.grpo_stats == "step":
    adv_N = grpo_step_advantages(scores_N, s.group_ids_N, cfg.norm_mode)
  else:
    adv_N = grpo_trajectory_advantages(scores_N, s.returns_N, s.group_ids_N, s.traj_ids_N, cfg.norm_mode)
  if cfg.adv_estimator == "gigpo":
    ret_N = discounted_returns(s.rewards_N, s.group_ids_N, s.traj_ids_N, s.step_idx_N, cfg.gigpo_gamma)
    anchor_N = anchor_groups(s.observations, s.group_ids_N, cfg.gigpo_similarity)
    adv_N = adv_N + cfg.gigpo_weight * gigpo_step_advantages(ret_N, anchor_N, cfg.norm_mode)
  return adv_N
