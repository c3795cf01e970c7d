"""SEED's per-token losses, on the device (pure, jit-friendly, per token [B, T]):
  ppo_dual_clip_BT, kl_BT, entropy_BT, opd_gated_BT, opd_advantage_BT, and `seed_loss`, the one place the
  update step gets its loss from. The advantages it is given come from seed_jax.advantages.

Micro-batch exactness: every loss is a masked *sum* divided by a normalizer computed once for the whole
mini-batch (`loss_normalizer`), so summing micro-batch losses gives exactly the mini-batch loss whatever the
split and however many all-zero padding rows there are. Metrics are returned as sums for the same reason.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections

from seed_jax.config import check_choice


F32 = jnp.float32
_sg = jax.lax.stop_gradient


class PgTerms(NamedTuple):
  loss_BT: jax.Array
  ratio_BT: jax.Array
  clipped_BT: jax.Array  # 1 where the clipped branch is the larger one (verl pg_clipfrac)
  dual_clipped_BT: jax.Array  # 1 where A < 0 and the −c·A cap binds (verl pg_clipfrac_lower)


def ppo_dual_clip_BT(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, clip_low: float,
                     clip_high: float, clip_c: float, max_log_ratio: float = 20.0) -> PgTerms:
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


def kl_BT(logp_BT: jax.Array, ref_logp_BT: jax.Array, estimator: str) -> jax.Array:
  """Per-token estimate of KL(π_θ‖π_ref) on the sampled token (verl's kl_penalty); ℓ_ref carries no gradient.
  k1: ℓ − ℓ_ref; k2: ½(ℓ − ℓ_ref)²; low_var_kl (k3): exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1 with ℓ_ref − ℓ clamped to
  ±20 before exp and the result clamped to [−10, 10]."""
  check_choice("objectives.kl_estimator", estimator)
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


def opd_gated_BT(logp_BT: jax.Array, skill_logp_BT: jax.Array, beta: float,
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
  check_choice("objectives.agg_mode", mode)
  m_BT = jnp.asarray(mask_BT) > 0
  count = m_BT.sum() if mode == "token-mean" else m_BT.any(-1).sum()
  return jnp.maximum(count.astype(F32), 1.0)


def aggregate(loss_BT: jax.Array, mask_BT: jax.Array, mode: str, normalizer: jax.Array) -> jax.Array:
  """One micro-batch's share of the mini-batch loss (verl's agg_loss, made split-invariant):
  token-mean, seq-mean-token-sum: Σ_bt m·L / N; seq-mean-token-mean: Σ_b (Σ_t m·L / max(Σ_t m, 1)) / N,
  with N = loss_normalizer(whole mini-batch mask, mode). Micro-batch results add up to the mini-batch loss."""
  check_choice("objectives.agg_mode", mode)
  x_BT = _masked(loss_BT.astype(F32), mask_BT)
  if mode == "seq-mean-token-mean":
    return jnp.sum(x_BT.sum(-1) / jnp.maximum((mask_BT > 0).sum(-1), 1)) / normalizer
  return x_BT.sum() / normalizer


# ============================================ the SEED loss ============================================

@dataclasses.dataclass(frozen=True)
class SeedLossConfig:
  """Static, hashable loss settings (a jit static argument); fields and meaning as in config.objectives
  (configs/base.py), which holds their defaults: build it with `from_config`."""
  agg_mode: str
  clip_low: float
  clip_high: float
  clip_c: float
  entropy_coef: float
  kl_coef: float
  kl_estimator: str
  opd_variant: str
  opd_coef: float
  opd_beta: float
  opd_adv_coef: float
  # clip_low, clip_high and clip_c are checked with the rest of the config (seed_jax.config.validate)

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
  check_choice("objectives.opd_variant", cfg.opd_variant)  # an unknown variant would silently drop OPD
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
