"""Every formula in seed_jax.losses against numbers worked out by hand."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from seed_jax import losses
from seed_jax.config import CHOICES


def loss_cfg(**overrides) -> losses.SeedLossConfig:
  """The loss settings of config.objectives (configs/base.py) with `overrides` replaced."""
  return dataclasses.replace(losses.SeedLossConfig.from_config(base.get_base().objectives), **overrides)


def close(a, b, tol=1e-6):
  np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)


# ------------------------------------------ per-token terms ------------------------------------------

def test_ppo_dual_clip():
  adv = jnp.array([[1., 1., 1., -1., -1., -1., 2., -2., -1.]])
  log_r = jnp.log(jnp.array([[1., 1.5, 0.5, 1.5, 5., 0.5, 1., 1., 1.]]))
  log_r = log_r.at[0, 6:8].set(100.).at[0, 8].set(-100.)  # extreme ratios, clamped at e^±20
  t = losses.ppo_dual_clip_BT(log_r - 3.0, jnp.full((1, 9), -3.0), adv, 0.2, 0.2, 3.0)
  close(t.loss_BT, [[-1., -1.2, -0.5, 1.5, 3., 0.8, -2.4, 6., 0.8]], 1e-5)
  close(t.clipped_BT, [[0, 1, 0, 0, 0, 1, 1, 0, 1]])
  close(t.dual_clipped_BT, [[0, 0, 0, 0, 1, 0, 0, 1, 0]])
  close(t.ratio_BT[0, 6:], [math.exp(20), math.exp(20), math.exp(-20)], 1e-5)
  grad = jax.grad(lambda l: losses.ppo_dual_clip_BT(l, jnp.zeros((1, 9)), adv, 0.2, 0.2, 3.0).loss_BT.sum())(log_r)
  assert np.isfinite(np.asarray(grad)).all()
  # Asymmetric clip-higher: ε_high = 0.28 lets A > 0 tokens rise to r = 1.28.
  close(losses.ppo_dual_clip_BT(jnp.log(jnp.array([1.5])), jnp.zeros(1), jnp.ones(1), 0.2, 0.28, 3.0).loss_BT, [-1.28])


def test_kl_estimators():
  logp, ref = jnp.array([-1., -2., -50., 0.]), jnp.array([-2., -1., 0., -50.])
  close(losses.kl_BT(logp, ref, "k1"), [1., -1., -50., 50.])
  close(losses.kl_BT(logp, ref, "k2"), [0.5, 0.5, 1250., 1250.])
  # k3: x = ℓ_ref − ℓ: e^x − x − 1 = [e^−1, e − 2, clamp(e^20 − 21), clamp(e^−20 + 19)].
  close(losses.kl_BT(logp, ref, "low_var_kl"), [0.3678794, 0.7182818, 10., 10.])
  # ℓ_ref − ℓ = 100 would overflow exp in fp32: the inner clamp keeps value and gradient finite.
  g = jax.grad(lambda lp: losses.kl_BT(lp, jnp.zeros(2), "low_var_kl").sum())(jnp.array([-100., -1.]))
  close(g, [0., 1. - math.exp(1.)])  # d/dℓ [e^{−ℓ} + ℓ − 1] = 1 − e^{−ℓ}; 0 where clamped
  with pytest.raises(ValueError, match="kl_estimator"):
    losses.kl_BT(logp, ref, "k4")


def test_opd_gated_and_positive_gap():
  logp, skill = jnp.array([-1., -2., -0.5]), jnp.array([-0.5, -2.3, -0.5])
  t = losses.opd_gated_BT(logp, skill, beta=5.0)
  close(t.gap_BT, [0.5, -0.3, 0.])
  close(t.gate_BT, [0.9241418, 0.1824255, 0.5])  # σ(2.5), σ(−1.5), σ(0)
  close(t.loss_BT, [0.4620709, -0.0547277, 0.])
  p = losses.opd_gated_BT(logp, skill, beta=5.0, positive_gap=True)
  close(p.loss_BT, [0.4620709, 0., 0.])
  close(p.active_BT, [1., 0., 0.])
  close(losses.opd_advantage_BT(logp, skill, 2.0), [1.0, -0.6, 0.])


def test_opd_gradient_is_minus_gate_over_active_count():
  logp = jnp.array([[-1., -2., -0.5], [-0.3, -0.7, -1.2], [-1., -1., -1.]])
  skill = jnp.array([[-0.5, -2.3, -0.5], [-0.1, -0.9, -1.2], [0., 0., 0.]])
  mask = jnp.array([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
  analyzed = jnp.array([1, 1, 0])  # row 2's analysis failed: no OPD signal there
  m = losses.opd_mask_BT(mask, analyzed)
  n = losses.loss_normalizer(m, "token-mean")
  close(n, 5.)

  def loss(lp, sk, positive_gap=False):
    return losses.aggregate(losses.opd_gated_BT(lp, sk, 5.0, positive_gap).loss_BT, m, "token-mean", n)

  gate = jax.nn.sigmoid(5.0 * (skill - logp))
  close(jax.grad(loss)(logp, skill), jnp.where(m, -gate / 5.0, 0.))
  close(jax.grad(loss)(logp, skill)[0], [-0.9241418 / 5, -0.1824255 / 5, 0.])
  close(jax.grad(loss, argnums=1)(logp, skill), jnp.zeros((3, 3)))
  # positive_gap: only Δ > 0 tokens ([0,0], [1,0]) get −g/Σm.
  close(jax.grad(lambda lp: loss(lp, skill, True))(logp),
        [[-0.9241418 / 5, 0., 0.], [-float(jax.nn.sigmoid(1.0)) / 5, 0., 0.], [0., 0., 0.]])


# --------------------------------------------- aggregation ---------------------------------------------

def test_aggregation_modes():
  loss = jnp.array([[1., 2., 3.], [4., 5., jnp.nan], [7., 8., jnp.inf]])
  mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
  for mode, n, value in (("token-mean", 3., 7 / 3), ("seq-mean-token-mean", 2., (1.5 + 4.) / 2),
                         ("seq-mean-token-sum", 2., (3. + 4.) / 2)):
    close(losses.loss_normalizer(mask, mode), n)
    close(losses.aggregate(loss, mask, mode, losses.loss_normalizer(mask, mode)), value)
    # Empty mask: normalizer floors at 1, loss 0, no NaN.
    empty = jnp.zeros((3, 3))
    close(losses.loss_normalizer(empty, mode), 1.)
    close(losses.aggregate(loss, empty, mode, losses.loss_normalizer(empty, mode)), 0.)
  with pytest.raises(ValueError, match="agg_mode"):
    losses.loss_normalizer(mask, "sum")


# --------------------------------------------- seed_loss ---------------------------------------------

def test_seed_loss_total_by_hand():
  cfg = loss_cfg()  # c_H 0.001, c_KL 0.01 (k3), λ_opd 0.01 gated, β 5, token-mean
  mask, analyzed = jnp.ones((1, 2)), jnp.ones(1)
  args = dict(old_logp_BT=jnp.array([[-1., -2.]]), adv=jnp.array([1.]), mask_BT=mask,
              norm=losses.loss_normalizers(mask, analyzed, cfg.agg_mode), cfg=cfg, entropy_BT=jnp.array([[1., 2.]]),
              ref_logp_BT=jnp.array([[-2., -1.]]), skill_logp_BT=jnp.array([[-0.5, -2.3]]), opd_mask_B=analyzed)
  loss, m = losses.seed_loss(jnp.array([[-1., -2.]]), **args)
  # pg: r = 1, A = 1 → −1. H mean 1.5. k3 mean (e^−1 + e − 2)/2 = 0.5430806. OPD mean (0.4620709 − 0.0547277)/2.
  close(m["pg_term"], -1.)
  close(m["kl_term"], 0.5430806)
  close(m["opd_term"], 0.2036716)
  close(loss, -1. - 0.001 * 1.5 + 0.01 * 0.5430806 + 0.01 * 0.2036716)
  close(loss, -0.9940325)
  f = losses.finalize_metrics(m)
  close([f["opd_gate_mean"], f["opd_gate_high_frac"], f["opd_gap_mean"], f["opd_active_tokens"]],
        [(0.9241418 + 0.1824255) / 2, 0.5, 0.1, 2.])
  close([f["pg_clipfrac"], f["ratio_mean"], f["ratio_max"], f["entropy"], f["tokens"]], [0., 1., 1., 1.5, 2.])
  # The whole loss has a gradient only through ℓ: teacher, old, reference and advantages get exactly 0.
  for name in ("old_logp_BT", "ref_logp_BT", "skill_logp_BT", "adv"):
    g = jax.grad(lambda x, name=name: losses.seed_loss(jnp.array([[-1., -2.]]), **{**args, name: x})[0])(args[name])
    assert np.all(np.asarray(g) == 0.), name
  # jit with the config static.
  close(jax.jit(losses.seed_loss, static_argnames="cfg")(jnp.array([[-1., -2.]]), **args)[0], -0.9940325)


def test_seed_loss_advantage_variants():
  mask, analyzed = jnp.ones((1, 2)), jnp.ones(1)
  logp = jnp.array([[-1.1, -2.]])
  r0 = math.exp(-0.1)

  def run(variant):
    cfg = loss_cfg(opd_variant=variant, entropy_coef=0., kl_coef=0., opd_adv_coef=1.0)
    return losses.seed_loss(logp, old_logp_BT=jnp.array([[-1., -2.]]), adv=jnp.ones((1, 2)), mask_BT=mask,
                        norm=losses.loss_normalizers(mask, analyzed, cfg.agg_mode), cfg=cfg,
                        skill_logp_BT=jnp.array([[-0.5, -2.3]]), opd_mask_B=analyzed)[0]

  # teacher_adv: A = 1 + (ℓ_skill − ℓ_old) = [1.5, 0.7]; r = [e^−0.1, 1] (inside the clip range).
  close(run("teacher_adv"), (-1.5 * r0 - 0.7) / 2)
  # reverse_kl_adv: A = 1 + sg(ℓ_skill − ℓ) = [1.6, 0.7].
  close(run("reverse_kl_adv"), (-1.6 * r0 - 0.7) / 2)
  close(run("none"), (-r0 - 1.) / 2)
  # The shaped advantage is built from stop-gradient quantities: no gradient into teacher or old log-probs.
  for variant in ("teacher_adv", "reverse_kl_adv"):
    cfg = loss_cfg(opd_variant=variant, entropy_coef=0., kl_coef=0.)
    f = lambda old, skill, cfg=cfg: losses.seed_loss(
        logp, old_logp_BT=old, adv=jnp.ones(1), mask_BT=mask,
        norm=losses.loss_normalizers(mask, analyzed, "token-mean"),
        cfg=cfg, skill_logp_BT=skill, opd_mask_B=analyzed)[0]
    for g in jax.grad(f, argnums=(0, 1))(jnp.array([[-1., -2.]]), jnp.array([[-0.5, -2.3]])):
      assert np.all(np.asarray(g) == 0.), variant
  # Its gradient is the PPO one for the shaped A: −A·r/N on unclipped tokens.
  close(jax.grad(lambda lp: losses.seed_loss(
      lp, old_logp_BT=jnp.array([[-1., -2.]]), adv=jnp.ones(1), mask_BT=mask,
      norm=losses.loss_normalizers(mask, analyzed, "token-mean"),
      cfg=loss_cfg(opd_variant="reverse_kl_adv", entropy_coef=0., kl_coef=0.),
      skill_logp_BT=jnp.array([[-0.5, -2.3]]), opd_mask_B=analyzed)[0])(logp), [[-1.6 * r0 / 2, -0.7 / 2]])


def test_seed_loss_bad_input():
  cfg = loss_cfg()
  mask = jnp.ones((1, 2))
  with pytest.raises(ValueError, match="config.objectives.opd_variant='kl' is not allowed"):
    losses.seed_loss(jnp.zeros((1, 2)), old_logp_BT=jnp.zeros((1, 2)), adv=jnp.ones(1), mask_BT=mask,
                     norm=losses.loss_normalizers(mask, None, cfg.agg_mode), cfg=loss_cfg(opd_variant="kl"))
  with pytest.raises(ValueError, match="skill_logp_BT"):
    losses.seed_loss(jnp.zeros((1, 2)), old_logp_BT=jnp.zeros((1, 2)), adv=jnp.ones(1), mask_BT=mask,
                 norm=losses.loss_normalizers(mask, None, cfg.agg_mode), cfg=cfg)
  with pytest.raises(ValueError, match="entropy"):
    losses.seed_loss(jnp.zeros((1, 2)), old_logp_BT=jnp.zeros((1, 2)), adv=jnp.ones(1), mask_BT=mask,
                 norm=losses.loss_normalizers(mask, None, cfg.agg_mode), cfg=loss_cfg(opd_variant="none"))
  assert losses.SeedLossConfig.from_config(base.get_base().objectives) == cfg


def _minibatch(seed=0, B=8, T=5):
  rng = np.random.default_rng(seed)
  mask = (rng.random((B, T)) < 0.7).astype(np.float32)
  mask[:, 0] = 1.
  mask[5] = 0.  # a padding row
  f = lambda *s: jnp.asarray(rng.normal(size=s).astype(np.float32))
  logp = -jnp.abs(f(B, T)) - 0.1
  return dict(logp=logp, old=logp + 0.3 * f(B, T), ref=logp + 0.5 * f(B, T), skill=logp + f(B, T),
              ent=jnp.abs(f(B, T)), adv=f(B), mask=jnp.asarray(mask),
              analyzed=jnp.asarray([1, 0, 1, 1, 0, 1, 1, 1], jnp.float32))


@pytest.mark.slow
@pytest.mark.parametrize("mode", CHOICES["objectives.agg_mode"])
@pytest.mark.parametrize("variant", ["gated", "positive_gap", "reverse_kl_adv"])
def test_microbatch_split_invariance(mode, variant):
  d = _minibatch()
  cfg = loss_cfg(agg_mode=mode, opd_variant=variant, opd_coef=0.5, entropy_coef=0.1, kl_coef=0.2)
  norm = losses.loss_normalizers(d["mask"], d["analyzed"], mode)  # once, for the whole mini-batch

  def total(logp, k):
    loss, sums = 0., None
    for idx in np.array_split(np.arange(8), k):
      l, m = losses.seed_loss(logp[idx], old_logp_BT=d["old"][idx], adv=d["adv"][idx], mask_BT=d["mask"][idx],
                          norm=norm, cfg=cfg, entropy_BT=d["ent"][idx], ref_logp_BT=d["ref"][idx],
                          skill_logp_BT=d["skill"][idx], opd_mask_B=d["analyzed"][idx])
      loss, sums = loss + l, m if sums is None else losses.accumulate_metrics(sums, m)
    return loss, sums

  (l1, m1), g1 = jax.value_and_grad(total, has_aux=True)(d["logp"], 1)
  for k in (2, 4):
    (lk, mk), gk = jax.value_and_grad(total, has_aux=True)(d["logp"], k)
    close(lk, l1)
    close(gk, g1)
    f1, fk = losses.finalize_metrics(m1), losses.finalize_metrics(mk)
    assert f1.keys() == fk.keys()
    close([fk[key] for key in f1], [f1[key] for key in f1], 1e-5)
  assert np.all(np.asarray(g1[5]) == 0.)  # the padding row gets no gradient
  # Against the plain whole-batch definition of the pg term.
  pg = losses.ppo_dual_clip_BT(d["logp"], d["old"], jnp.broadcast_to(d["adv"][:, None], (8, 5)), cfg.clip_low,
                                cfg.clip_high, cfg.clip_c).loss_BT
  if variant != "reverse_kl_adv":
    m = np.asarray(d["mask"]) > 0
    pg = np.where(m, np.asarray(pg), 0.)
    want = {"token-mean": pg.sum() / m.sum(), "seq-mean-token-sum": pg.sum() / m.any(1).sum(),
            "seq-mean-token-mean": (pg.sum(1) / np.maximum(m.sum(1), 1)).sum() / m.any(1).sum()}[mode]
    close(m1["pg_term"], want)


def test_padding_rows_do_not_change_the_loss():
  d = _minibatch()
  cfg = loss_cfg()
  keep = np.array([0, 1, 2, 3, 4, 6, 7])

  def loss(idx):
    norm = losses.loss_normalizers(d["mask"][idx], d["analyzed"][idx], cfg.agg_mode)
    return losses.seed_loss(d["logp"][idx] * 50., old_logp_BT=d["old"][idx], adv=d["adv"][idx], mask_BT=d["mask"][idx],
                        norm=norm, cfg=cfg, entropy_BT=d["ent"][idx], ref_logp_BT=d["ref"][idx],
                        skill_logp_BT=d["skill"][idx], opd_mask_B=d["analyzed"][idx])[0]

  close(loss(np.arange(8)), loss(keep))
  assert np.isfinite(float(loss(np.arange(8))))
