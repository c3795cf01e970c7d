"""All of SEED's arithmetic: advantages (host, numpy) and per-token losses (device, jnp).

Host side (observations are text, so grouping runs in numpy/Python):
  penalized_scores → grpo_step_advantages | grpo_trajectory_advantages, optionally + ω·GiGPO step advantages;
  `compute_advantages(StepSamples, cfg)` assembles them from the config.
Device side (pure, jit-friendly, per token [B, T]):
  ppo_dual_clip_BT, kl_BT, entropy_BT, opd_gated_BT, opd_advantage_BT, and `seed_loss`, the one place the
  update step gets its loss from.

Micro-batch exactness: every loss is a masked *sum* divided by a normalizer computed once for the whole
mini-batch (`loss_normalizer`), so summing micro-batch losses gives exactly the mini-batch loss whatever the
split and however many all-zero padding rows there are. Metrics are returned as sums for the same reason.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import NamedTuple, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from seed_jax.envs.base import Trajectory

NORM_MODES = ("mean_std_norm", "mean_norm")
GRPO_STATS = ("step", "trajectory")
ADV_ESTIMATORS = ("grpo", "gigpo")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k2", "low_var_kl")
OPD_VARIANTS = ("gated", "positive_gap", "reverse_kl_adv", "teacher_adv", "none")
EPS = 1e-6  # A = (s − μ)/(σ + EPS), as in verl's GRPO


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # --- advantages (host) ---
  c.adv_estimator = "grpo"  # "grpo" | "gigpo" (GRPO episode advantage + gigpo_weight · anchor-state step advantage)
  c.norm_mode = "mean_std_norm"  # "mean_std_norm": (s − μ)/(σ + 1e-6); "mean_norm": s − μ (WebShop)
  c.grpo_stats = "step"  # "step": μ, unbiased σ over all step-samples of a group (reference code);
  #                        "trajectory": μ, population σ over the group's trajectory returns (paper)
  c.invalid_penalty = 0.1  # c_inv subtracted from the score of a step whose action did not parse (Search: 0.01)
  c.gigpo_gamma = 0.95  # γ of GiGPO's discounted step returns
  c.gigpo_weight = 1.0  # ω in A = A^E + ω·A^S
  c.gigpo_similarity = 1.0  # anchor-state match: 1.0 = identical text; < 1 = difflib ratio ≥ this value
  # --- loss (device) ---
  c.agg_mode = "token-mean"  # "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum"
  c.clip_low = 0.2  # ε_low: ratio clipped below at 1 − ε_low
  c.clip_high = 0.2  # ε_high: ratio clipped above at 1 + ε_high (asymmetric "clip-higher" when > clip_low)
  c.clip_c = 3.0  # dual-clip c: for A < 0 the loss is capped at −c·A
  c.entropy_coef = 0.001  # c_H in pg − c_H·H (Search: 0)
  c.kl_coef = 0.01  # c_KL for the KL to the reference (Search: 0.001; 0 disables, ref log-probs not needed)
  c.kl_estimator = "low_var_kl"  # "k1" | "k2" | "low_var_kl" (k3)
  c.opd_variant = "gated"  # "gated" | "positive_gap" | "reverse_kl_adv" | "teacher_adv" | "none"
  c.opd_coef = 0.01  # λ_opd, weight of the OPD loss term ("gated", "positive_gap")
  c.opd_beta = 5.0  # β of the gate g = σ(β·Δ)
  c.opd_adv_coef = 1.0  # λ / w of the advantage-shaping variants ("reverse_kl_adv", "teacher_adv")
  return c


def _check(name: str, value, allowed: Sequence) -> None:
  if value not in allowed:
    raise ValueError(f"{name}={value!r} is not one of {tuple(allowed)}")


# ============================================ host: advantages ============================================

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
  _check("norm_mode", mode, NORM_MODES)
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


def anchor_groups(observations: Sequence[str], group_ids_N: np.ndarray, similarity: float = 1.0) -> np.ndarray:
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
  """Per step-sample advantage [N] from the config: GRPO A^E (+ ω·A^S for GiGPO)."""
  _check("adv_estimator", cfg.adv_estimator, ADV_ESTIMATORS)
  _check("grpo_stats", cfg.grpo_stats, GRPO_STATS)
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


# ========================================= device: per-token losses =========================================

F32 = jnp.float32
_sg = jax.lax.stop_gradient


class PgTerms(NamedTuple):
  loss_BT: jax.Array
  ratio_BT: jax.Array
  clipped_BT: jax.Array  # 1 where the clipped branch is the larger one (verl pg_clipfrac)
  dual_clipped_BT: jax.Array  # 1 where A < 0 and the −c·A cap binds (verl pg_clipfrac_lower)


def ppo_dual_clip_BT(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, clip_low: float = 0.2,
                     clip_high: float = 0.2, clip_c: float = 3.0, max_log_ratio: float = 20.0) -> PgTerms:
  """PPO clipped surrogate with dual clip, per token (as verl's compute_policy_loss):
  r = exp(clamp(ℓ − ℓ_old, ±max_log_ratio)); L = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high));
  for A < 0: L = min(L, −c·A). A and ℓ_old carry no gradient; the clamp keeps r finite."""
  adv_BT = _sg(adv_BT)
  ratio_BT = jnp.exp(jnp.clip(logp_BT - _sg(old_logp_BT), -max_log_ratio, max_log_ratio))
  unclipped_BT = -adv_BT * ratio_BT
  clipped_BT = -adv_BT * jnp.clip(ratio_BT, 1.0 - clip_low, 1.0 + clip_high)
  loss_BT = jnp.maximum(unclipped_BT, clipped_BT)
  cap_BT = -adv_BT * clip_c
  dual_BT = (adv_BT < 0) & (loss_BT > cap_BT)
  return PgTerms(jnp.where(dual_BT, cap_BT, loss_BT), ratio_BT, (clipped_BT > unclipped_BT).astype(F32),
                 dual_BT.astype(F32))


def kl_BT(logp_BT: jax.Array, ref_logp_BT: jax.Array, estimator: str = "low_var_kl") -> jax.Array:
  """Per-token estimate of KL(π_θ‖π_ref) on the sampled token (verl's kl_penalty); ℓ_ref carries no gradient.
  k1: ℓ − ℓ_ref; k2: ½(ℓ − ℓ_ref)²; low_var_kl (k3): exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1 with ℓ_ref − ℓ clamped to
  ±20 before exp and the result clamped to [−10, 10]."""
  _check("kl_estimator", estimator, KL_ESTIMATORS)
  d_BT = logp_BT - _sg(ref_logp_BT)
  if estimator == "k1":
    return d_BT
  if estimator == "k2":
    return 0.5 * d_BT ** 2
  x_BT = jnp.clip(-d_BT, -20.0, 20.0)
  return jnp.clip(jnp.exp(x_BT) - x_BT - 1.0, -10.0, 10.0)


class OpdTerms(NamedTuple):
  loss_BT: jax.Array
  gate_BT: jax.Array  # g = σ(β·Δ)
  gap_BT: jax.Array  # Δ = ℓ_skill − ℓ
  active_BT: jax.Array  # 1 where the token contributes (all, or Δ > 0 for positive_gap)


def opd_gated_BT(logp_BT: jax.Array, skill_logp_BT: jax.Array, beta: float = 5.0,
                 positive_gap: bool = False) -> OpdTerms:
  """SEED's OPD term per token: Δ = sg(ℓ_skill − ℓ), g = sg(σ(β·Δ)), L = g·(sg(ℓ_skill) − ℓ), so ∂L/∂ℓ = −g:
  it always raises the sampled token, strongly where the skill made it more likely (g > 0.5). No ratio, no clip.
  positive_gap: only tokens with Δ > 0 contribute (L = 0 elsewhere).
  ℓ_skill is the same response re-scored under the skill-augmented prompt; whether by π_old (reference code) or
  by the current π_θ (paper) is the caller's choice; it carries no gradient either way."""
  skill_BT = _sg(skill_logp_BT)
  gap_BT = _sg(skill_BT - logp_BT)
  gate_BT = jax.nn.sigmoid(beta * gap_BT)
  active_BT = gap_BT > 0 if positive_gap else jnp.ones(gap_BT.shape, bool)
  loss_BT = jnp.where(active_BT, gate_BT * (skill_BT - logp_BT), 0.0)
  return OpdTerms(loss_BT, gate_BT, gap_BT, active_BT.astype(F32))


def opd_advantage_BT(student_logp_BT: jax.Array, skill_logp_BT: jax.Array, coef: float) -> jax.Array:
  """Advantage-shaping OPD term coef·sg(ℓ_skill − ℓ_student), added to A on analyzed tokens. With the current
  policy as student it is the sampled-token reverse-KL advantage −λ(ℓ − ℓ_skill) of on-policy distillation
  (tinker-cookbook); with ℓ_old it is the reference code's teacher advantage w·(ℓ_skill − ℓ_old)."""
  return coef * _sg(skill_logp_BT - student_logp_BT)


# ============================================ aggregation ============================================

def _masked(x_BT: jax.Array, mask_BT: jax.Array) -> jax.Array:
  return jnp.where(mask_BT > 0, x_BT, 0.0)  # where, not ×: garbage (inf/NaN) on padding cannot leak


def loss_normalizer(mask_BT: jax.Array, mode: str) -> jax.Array:
  """Global normalizer N for `aggregate`, computed once over the *whole* mini-batch (padding rows count 0):
  token-mean: Σ mask; seq-mean-token-mean / seq-mean-token-sum: number of rows with ≥ 1 token. Floored at 1,
  so an all-masked batch gives loss 0, not NaN."""
  _check("agg_mode", mode, AGG_MODES)
  m_BT = jnp.asarray(mask_BT) > 0
  count = m_BT.sum() if mode == "token-mean" else m_BT.any(-1).sum()
  return jnp.maximum(count.astype(F32), 1.0)


def aggregate(loss_BT: jax.Array, mask_BT: jax.Array, mode: str, normalizer: jax.Array) -> jax.Array:
  """One micro-batch's share of the mini-batch loss (verl's agg_loss, made split-invariant):
  token-mean, seq-mean-token-sum: Σ_bt m·L / N; seq-mean-token-mean: Σ_b (Σ_t m·L / max(Σ_t m, 1)) / N,
  with N = loss_normalizer(whole mini-batch mask, mode). Micro-batch results add up to the mini-batch loss."""
  _check("agg_mode", mode, AGG_MODES)
  x_BT = _masked(loss_BT.astype(F32), mask_BT)
  if mode == "seq-mean-token-mean":
    return jnp.sum(x_BT.sum(-1) / jnp.maximum((mask_BT > 0).sum(-1), 1)) / normalizer
  return x_BT.sum() / normalizer


# ============================================ the SEED loss ============================================

@dataclasses.dataclass(frozen=True)
class SeedLossConfig:
  """Static, hashable loss settings (a jit static argument); fields and meaning as in default_config()."""
  agg_mode: str = "token-mean"
  clip_low: float = 0.2
  clip_high: float = 0.2
  clip_c: float = 3.0
  entropy_coef: float = 0.001
  kl_coef: float = 0.01
  kl_estimator: str = "low_var_kl"
  opd_variant: str = "gated"
  opd_coef: float = 0.01
  opd_beta: float = 5.0
  opd_adv_coef: float = 1.0

  def __post_init__(self):
    _check("agg_mode", self.agg_mode, AGG_MODES)
    _check("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
    _check("opd_variant", self.opd_variant, OPD_VARIANTS)
    if not (0.0 <= self.clip_low < 1.0 and self.clip_high >= 0.0):
      raise ValueError(f"clip_low={self.clip_low} must be in [0, 1) and clip_high={self.clip_high} >= 0")
    if self.clip_c <= 1.0:
      raise ValueError(f"clip_c={self.clip_c} must be > 1 (dual clip caps the loss at -clip_c*A for A < 0)")

  @classmethod
  def from_config(cls, cfg: ml_collections.ConfigDict) -> "SeedLossConfig":
    return cls(**{f.name: cfg[f.name] for f in dataclasses.fields(cls)})

  @property
  def uses_skill(self) -> bool:
    """Whether seed_loss needs skill_logp_BT and opd_mask_B."""
    return self.opd_variant != "none"


@flax.struct.dataclass
class LossNormalizers:
  """Whole-mini-batch normalizers (scalars): `main` for pg/entropy/KL over the response mask, `opd` for the OPD
  term over response mask × trajectory-was-analyzed."""
  main: jax.Array
  opd: jax.Array


def opd_mask_BT(mask_BT: jax.Array, opd_mask_B: jax.Array) -> jax.Array:
  """m = response mask × trajectory-was-analyzed (bool)."""
  return (jnp.asarray(mask_BT) > 0) & (jnp.asarray(opd_mask_B)[:, None] > 0)


def loss_normalizers(mask_BT: jax.Array, opd_mask_B: jax.Array | None, mode: str) -> LossNormalizers:
  """loss_normalizer for both masks, over the whole mini-batch (call once, before splitting)."""
  opd = opd_mask_BT(mask_BT, opd_mask_B) if opd_mask_B is not None else jnp.zeros(jnp.shape(mask_BT), bool)
  return LossNormalizers(loss_normalizer(mask_BT, mode), loss_normalizer(opd, mode))


def seed_loss(logp_BT: jax.Array, *, old_logp_BT: jax.Array, adv: jax.Array, mask_BT: jax.Array,
              norm: LossNormalizers, cfg: SeedLossConfig, entropy_BT: jax.Array | None = None,
              ref_logp_BT: jax.Array | None = None, skill_logp_BT: jax.Array | None = None,
              opd_mask_B: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """One micro-batch's loss: pg − c_H·H + c_KL·KL + λ_opd·L_opd, each term aggregated with cfg.agg_mode over
  its mask and divided by the whole mini-batch's normalizer `norm`, so micro-batch losses add up exactly.

  logp_BT: current policy on the ordinary prompt (temperature-scaled), the only input with a gradient;
  entropy_BT: its per-token entropy; old/ref/skill_logp_BT: π_old, reference and skill-prompted log-probs of the
  same tokens; adv: [B] or [B, T]; mask_BT: response tokens (padding rows all 0); opd_mask_B: trajectory analyzed.
  Terms whose coefficient is 0 need no input. The advantage variants of OPD add their term to A instead.
  Returns (loss, metrics): metrics are sums (see finalize_metrics), plus each normalized term (`*_term`) and
  `loss`, which add up over micro-batches like the loss itself.
  """
  mask_BT = jnp.asarray(mask_BT) > 0
  logp_BT, old_logp_BT = logp_BT.astype(F32), old_logp_BT.astype(F32)
  adv_BT = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp_BT.shape).astype(F32)
  agg = lambda x_BT, m_BT, n: aggregate(x_BT, m_BT, cfg.agg_mode, n)
  msum = lambda x_BT, m_BT: _masked(x_BT.astype(F32), m_BT).sum()
  metrics = {"tokens": mask_BT.sum().astype(F32), "seqs": mask_BT.any(-1).sum().astype(F32)}

  if cfg.uses_skill:
    if skill_logp_BT is None or opd_mask_B is None:
      raise ValueError(f"opd_variant={cfg.opd_variant!r} needs skill_logp_BT and opd_mask_B")
    skill_BT, m_BT = skill_logp_BT.astype(F32), opd_mask_BT(mask_BT, opd_mask_B)
    metrics["opd_tokens"] = m_BT.sum().astype(F32)
    metrics["opd_gap_sum"] = msum(_sg(skill_BT - logp_BT), m_BT)
  if cfg.opd_variant in ("reverse_kl_adv", "teacher_adv"):
    student_BT = logp_BT if cfg.opd_variant == "reverse_kl_adv" else old_logp_BT
    opd_adv_BT = _masked(opd_advantage_BT(student_BT, skill_BT, cfg.opd_adv_coef), m_BT)
    adv_BT = adv_BT + opd_adv_BT
    metrics["opd_adv_sum"] = opd_adv_BT.sum()
    metrics["opd_active_tokens"] = metrics["opd_tokens"]

  pg = ppo_dual_clip_BT(logp_BT, old_logp_BT, adv_BT, cfg.clip_low, cfg.clip_high, cfg.clip_c)
  total = metrics["pg_term"] = agg(pg.loss_BT, mask_BT, norm.main)
  metrics.update(pg_loss_sum=msum(pg.loss_BT, mask_BT), pg_clip_sum=msum(pg.clipped_BT, mask_BT),
                 pg_dual_clip_sum=msum(pg.dual_clipped_BT, mask_BT), ratio_sum=msum(pg.ratio_BT, mask_BT),
                 ratio_max=jnp.max(_masked(pg.ratio_BT, mask_BT)))  # r > 0, so 0 is a neutral fill

  for name, coef, value_BT in (("entropy", -cfg.entropy_coef, entropy_BT), ("kl", cfg.kl_coef, ref_logp_BT)):
    if value_BT is None:
      if coef:
        raise ValueError(f"{name} coefficient is {abs(coef)} but no {name} input was given")
      continue
    x_BT = value_BT.astype(F32) if name == "entropy" else kl_BT(logp_BT, value_BT.astype(F32), cfg.kl_estimator)
    metrics[f"{name}_sum"] = msum(x_BT, mask_BT)
    metrics[f"{name}_term"] = agg(x_BT, mask_BT, norm.main)
    total = total + coef * metrics[f"{name}_term"]

  if cfg.opd_variant in ("gated", "positive_gap"):
    opd = opd_gated_BT(logp_BT, skill_BT, cfg.opd_beta, positive_gap=cfg.opd_variant == "positive_gap")
    metrics["opd_term"] = agg(opd.loss_BT, m_BT, norm.opd)
    total = total + cfg.opd_coef * metrics["opd_term"]
    metrics.update(opd_loss_sum=msum(opd.loss_BT, m_BT), opd_gate_sum=msum(opd.gate_BT, m_BT),
                   opd_gate_high_sum=msum((opd.gate_BT > 0.5).astype(F32), m_BT),
                   opd_active_tokens=msum(opd.active_BT, m_BT))
  metrics["loss"] = total
  return total, metrics


# (sum key, mean key, denominator key) for finalize_metrics
_MEANS = (("pg_loss_sum", "pg_loss", "tokens"), ("pg_clip_sum", "pg_clipfrac", "tokens"),
          ("pg_dual_clip_sum", "pg_dual_clipfrac", "tokens"), ("ratio_sum", "ratio_mean", "tokens"),
          ("entropy_sum", "entropy", "tokens"), ("kl_sum", "kl", "tokens"),
          ("opd_loss_sum", "opd_loss", "opd_tokens"), ("opd_gate_sum", "opd_gate_mean", "opd_tokens"),
          ("opd_gate_high_sum", "opd_gate_high_frac", "opd_tokens"), ("opd_gap_sum", "opd_gap_mean", "opd_tokens"),
          ("opd_adv_sum", "opd_adv_mean", "opd_tokens"))


def accumulate_metrics(acc: dict[str, jax.Array], new: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Combines the metric sums of two micro-batches of one mini-batch: adds, except ratio_max (max)."""
  return {k: jnp.maximum(acc[k], v) if k == "ratio_max" else acc[k] + v for k, v in new.items()}


def finalize_metrics(sums: dict) -> dict[str, float]:
  """Means from (accumulated) metric sums: each *_sum divided by its token count (0 when there were none),
  e.g. pg_clipfrac, pg_dual_clipfrac, ratio_mean, opd_gate_mean, opd_gate_high_frac (share of g > 0.5),
  opd_gap_mean; counts, ratio_max and the normalized terms pass through."""
  out = {k: float(v) for k, v in sums.items() if not k.endswith("_sum")}
  for key, mean_key, denom in _MEANS:
    if key in sums:
      n = float(sums[denom])
      out[mean_key] = float(sums[key]) / n if n > 0 else 0.0
  return out
