"""The train step: micro-batch accumulation, the teacher plan, padding rows, the GRPO special case, the OPD
gradient with teacher == student, and the non-finite guard."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import base
from seed_jax import batch as batch_lib
from seed_jax import losses
from seed_jax import update as update_lib
from seed_jax.models import transformer as tf
from seed_jax.models import xla_cpu
from seed_jax.models.logprobs import response_logprobs
from seed_jax.models.spec import ModelSpec


def _loss(**overrides) -> losses.SeedLossConfig:
  return dataclasses.replace(losses.SeedLossConfig.from_config(base.get_base().objectives), **overrides)


def _tiny_batch(B=4, P=6, R=5, seed=0):
  rng = np.random.default_rng(seed)
  spec = ModelSpec("Qwen3ForCausalLM", vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                   ffn_dim=48)
  params = tf.init_params(spec, 1)
  params["embed"] = params["embed"] * 30
  rmask = np.ones((B, R), bool)
  rmask[1, 3:] = False
  mb = batch_lib.MiniBatch(
      prompt_BP=rng.integers(1, 64, (B, P)).astype(np.int32), pvalid_BP=np.ones((B, P), bool),
      resp_BR=rng.integers(1, 64, (B, R)).astype(np.int32), rmask_BR=rmask,
      old_logp_BR=np.full((B, R), -2.0, np.float32), adv_B=np.array([1.0, -0.5, 0.3, -1.2], np.float32),
      ref_logp_BR=np.full((B, R), -2.5, np.float32), skill_logp_BR=rng.normal(-2, 1, (B, R)).astype(np.float32),
      opd_mask_B=np.array([True, False, True, True]))
  return spec, params, jax.tree.map(jnp.asarray, mb)


def _with_skill_prompts(mb, seed=1):
  """Skill prompts that differ from the ordinary ones (a shifted token stream, two left-padding columns)."""
  pvalid = np.ones(mb.pvalid_BP.shape, bool)
  pvalid[:, :2] = False
  prompt = np.where(pvalid, (np.asarray(mb.prompt_BP) + 7 * seed) % 63 + 1, 0).astype(np.int32)
  return mb.replace(skill_prompt_BP=jnp.asarray(prompt), skill_pvalid_BP=jnp.asarray(pvalid))


def _step(spec, params, mb, loss_cfg, micro, teacher="old"):
  """One update with plain SGD (lr 1): the parameter change is exactly minus the accumulated gradient."""
  opt = optax.sgd(1.0)
  fn = update_lib.make_update_fn(spec, loss_cfg, opt, micro_batch_size=micro, chunk=4, remat=False,
                                 teacher=update_lib.teacher_plan(loss_cfg, teacher))
  return fn(update_lib.init_state(jax.tree.map(jnp.copy, params), opt), mb, jnp.float32(1.0))


def _assert_trees_close(a, b, atol):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-5), a, b)


@pytest.mark.slow
@pytest.mark.parametrize("teacher", ["old", "current"])
def test_micro_batch_accumulation_equals_one_big_batch(teacher):
  spec, params, mb = _tiny_batch()
  mb = _with_skill_prompts(mb)
  loss_cfg = _loss(opd_variant="gated", opd_coef=0.5, entropy_coef=0.01, kl_coef=0.1)
  # The whole mini-batch as one micro-batch, with the gradient of micro_loss taken directly (no scan).
  norm = losses.loss_normalizers(mb.rmask_BR, mb.opd_mask_B, loss_cfg.agg_mode)
  (loss, _), grad = jax.jit(jax.value_and_grad(
      lambda p: update_lib.micro_loss(p, mb, norm, 1.0, spec=spec, loss_cfg=loss_cfg, dtype=jnp.float32, chunk=4,
                                      remat=False, teacher=update_lib.teacher_plan(loss_cfg, teacher)),
      has_aux=True))(params)
  want = jax.tree.map(lambda p, g: p - g, params, grad)
  assert float(optax.tree.norm(grad)) > 1e-3
  for micro in (2, 1):
    state, sums = _step(spec, params, mb, loss_cfg, micro, teacher)
    _assert_trees_close(state.params, want, 1e-6)
    np.testing.assert_allclose(float(sums["loss"]), float(loss), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(sums["grad_norm"]), float(optax.tree.norm(grad)), rtol=1e-5)
    assert int(state.step) == 1 and float(sums["update_skipped"]) == 0.0


def test_teacher_plan_decides_both_sides():
  gated, none = _loss(opd_variant="gated"), _loss(opd_variant="none")
  plan = lambda cfg, t: (lambda p: (p.rescore_skill_prompts, p.update_reads_skill_prompts))(
      update_lib.teacher_plan(cfg, t))
  assert plan(gated, "old") == (True, False)
  assert plan(gated, "current") == (False, True)
  assert plan(none, "old") == plan(none, "current") == (False, False)
  with pytest.raises(ValueError, match=r"config.learner.teacher='new' is not allowed"):
    update_lib.teacher_plan(gated, "new")


def test_teacher_plan_decides_the_layout_rules():
  """Image observations take teacher "old" (even without a skill term); packed update rows serve a teacher
  that the update does not score, else the update gets padded rows."""
  gated, none = _loss(opd_variant="gated"), _loss(opd_variant="none")
  with pytest.raises(ValueError, match=r"config.env.observation='image' serves config.learner.teacher='old' only"):
    update_lib.teacher_plan(none, "current", images=True)
  assert update_lib.teacher_plan(gated, "old", images=True, pack_length=1536).update_pack_length == 1536
  assert update_lib.teacher_plan(gated, "current", pack_length=1536).update_pack_length == 0
  assert update_lib.teacher_plan(none, "current", pack_length=1536).update_pack_length == 1536
  assert update_lib.teacher_plan(gated, "old").update_pack_length == 0


@pytest.mark.slow
def test_teachers_differ_only_through_the_skill_log_probs():
  # With skill prompts equal to the ordinary prompts and the π_old teacher row set to π_θ's own log-probs, the
  # two teachers see the same numbers: the same update. Different skill prompts change it.
  spec, params, mb = _tiny_batch()
  loss_cfg = _loss(opd_variant="gated", opd_coef=1.0)
  logp, _ = jax.jit(lambda p: response_logprobs(p, spec, mb.prompt_BP, mb.pvalid_BP, mb.resp_BR, mb.rmask_BR, 1.0,
                                                dtype=jnp.float32, chunk=4))(params)
  same = mb.replace(skill_logp_BR=logp, skill_prompt_BP=mb.prompt_BP, skill_pvalid_BP=mb.pvalid_BP)
  old, _ = _step(spec, params, same, loss_cfg, 2, "old")
  cur, _ = _step(spec, params, same, loss_cfg, 2, "current")
  _assert_trees_close(cur.params, old.params, 1e-6)
  other, _ = _step(spec, params, _with_skill_prompts(same), loss_cfg, 2, "current")
  assert float(jnp.abs(other.params["embed"] - cur.params["embed"]).max()) > 1e-5


@pytest.mark.slow
def test_padding_rows_change_nothing():
  spec, params, mb = _tiny_batch()
  loss_cfg = _loss(opd_variant="gated", opd_coef=0.5, entropy_coef=0.01, kl_coef=0.1)
  pad = lambda x, fill: jnp.concatenate([x, jnp.full((4,) + x.shape[1:], fill, x.dtype)])
  # Four padding rows as batch.minibatch writes them: no response tokens, zero advantage, no OPD.
  padded = batch_lib.MiniBatch(
      prompt_BP=pad(mb.prompt_BP, 0), pvalid_BP=pad(mb.pvalid_BP, False), resp_BR=pad(mb.resp_BR, 0),
      rmask_BR=pad(mb.rmask_BR, False), old_logp_BR=pad(mb.old_logp_BR, 0.0), adv_B=pad(mb.adv_B, 0.0),
      ref_logp_BR=pad(mb.ref_logp_BR, 0.0), skill_logp_BR=pad(mb.skill_logp_BR, 0.0),
      opd_mask_B=pad(mb.opd_mask_B, False))
  a, sa = _step(spec, params, mb, loss_cfg, 2)
  b, sb = _step(spec, params, padded, loss_cfg, 2)
  _assert_trees_close(b.params, a.params, 1e-6)
  for k in ("loss", "tokens", "seqs", "opd_tokens", "pg_term", "grad_norm"):
    np.testing.assert_allclose(float(sb[k]), float(sa[k]), rtol=1e-5, atol=1e-7, err_msg=k)


@pytest.mark.slow
def test_zero_opd_weight_equals_plain_grpo_update():
  spec, params, mb = _tiny_batch()
  opt = update_lib.make_optimizer(base.get_base().learner)
  results = []
  for loss_cfg in (_loss(opd_variant="gated", opd_coef=0.0),
                   _loss(opd_variant="none")):
    fn = update_lib.make_update_fn(spec, loss_cfg, opt, micro_batch_size=2, chunk=4, remat=False)
    state = update_lib.init_state(jax.tree.map(jnp.copy, params), opt)
    results.append(fn(state, mb, jnp.float32(1.0))[0].params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-7), *results)


@pytest.mark.slow
def test_teacher_equal_to_student_gives_gated_nll_with_gate_half():
  spec, params, mb = _tiny_batch()
  mb = mb.replace(adv_B=jnp.zeros_like(mb.adv_B), opd_mask_B=jnp.ones_like(mb.opd_mask_B),
                  skill_prompt_BP=mb.prompt_BP, skill_pvalid_BP=mb.pvalid_BP)
  loss_cfg = _loss(opd_variant="gated", opd_coef=1.0, entropy_coef=0.0, kl_coef=0.0)
  norm = losses.loss_normalizers(mb.rmask_BR, mb.opd_mask_B, loss_cfg.agg_mode)
  grad = jax.grad(lambda p: update_lib.micro_loss(p, mb, norm, 1.0, spec=spec, loss_cfg=loss_cfg, dtype=jnp.float32,
                                                  chunk=4, remat=False,
                                                  teacher=update_lib.teacher_plan(loss_cfg, "current"))[0])(params)

  def gated_nll(p):  # −0.5 · Σ m ℓ / Σ m
    logp, _ = response_logprobs(p, spec, mb.prompt_BP, mb.pvalid_BP, mb.resp_BR, mb.rmask_BR, 1.0,
                                dtype=jnp.float32, chunk=4)
    return -0.5 * jnp.sum(logp * mb.rmask_BR) / jnp.sum(mb.rmask_BR)

  expect = jax.grad(gated_nll)(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5),
               grad, expect)


@pytest.mark.slow
def test_non_finite_loss_skips_the_update_and_counts_it():
  spec, params, mb = _tiny_batch()
  opt = update_lib.make_optimizer(base.get_base().learner)
  fn = update_lib.make_update_fn(spec, _loss(), opt, micro_batch_size=2, chunk=4, remat=False)
  state = update_lib.init_state(jax.tree.map(jnp.copy, params), opt)
  bad = mb.replace(ref_logp_BR=mb.ref_logp_BR.at[0, 0].set(jnp.nan))
  new, metrics = fn(state, bad, jnp.float32(1.0))
  assert int(new.skipped) == 1 and int(new.step) == 0 and float(metrics["update_skipped"]) == 1.0
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), new.params, params)
  good, _ = fn(new, mb, jnp.float32(1.0))
  assert int(good.step) == 1 and int(good.skipped) == 1


def test_warmup_constant_sets_the_lr_per_update():
  """"warmup_constant" (verl's constant-with-warmup, stepped once per RL update): lr 0 at update 0, linear to
  cfg.lr at update int(warmup_frac x num_updates), then flat; an update at lr x equals constant-lr AdamW at x."""
  cfg = base.get_base().learner
  cfg.lr, cfg.schedule, cfg.warmup_frac = 1e-3, "warmup_constant", 0.1
  assert [update_lib.update_lr(cfg, u, 50) for u in (0, 1, 4, 5, 49)] == [0.0, 2e-4, 8e-4, 1e-3, 1e-3]
  cfg.warmup_frac = 0.0
  assert update_lib.update_lr(cfg, 0, 50) == 1e-3
  spec, params, mb = _tiny_batch()
  fn = lambda opt: update_lib.make_update_fn(spec, _loss(), opt, micro_batch_size=2, chunk=4, remat=False)
  cfg.schedule = "warmup_constant"
  opt = update_lib.make_optimizer(cfg)
  state = lambda: update_lib.init_state(jax.tree.map(jnp.copy, params), opt)  # the step donates its state
  step = fn(opt)  # one compile: the update's lr is state, not a constant of the program
  frozen, _ = step(update_lib.with_update_lr(state(), 0.0), mb, jnp.float32(1.0))
  _assert_trees_close(frozen.params, params, atol=0)  # update 0 of a warm-up moves nothing
  moved, _ = step(update_lib.with_update_lr(state(), 4e-4), mb, jnp.float32(1.0))
  cfg.schedule, cfg.lr = "constant", 4e-4
  const = update_lib.make_optimizer(cfg)
  ref, _ = fn(const)(update_lib.init_state(jax.tree.map(jnp.copy, params), const), mb, jnp.float32(1.0))
  _assert_trees_close(moved.params, ref.params, atol=1e-7)
  assert float(jnp.abs(moved.params["embed"] - params["embed"]).max()) > 1e-5


def test_grouped_micro_batches_equal_the_flat_layout_on_eight_devices():
  """distributed.grouped_global_batch: each micro-batch's rows spread over the 8 devices (what every process
  count feeds the update) gives the flat single-device layout's update."""
  from seed_jax.infra import distributed
  from seed_jax.infra.mesh import make_mesh
  from tests.scale_helpers import random_minibatch
  spec, params, _ = _tiny_batch()
  mb = random_minibatch(16, 6, 5, spec.vocab_size)
  loss_cfg = _loss(opd_variant="gated", opd_coef=0.5, entropy_coef=0.01, kl_coef=0.1)
  flat, _ = _step(spec, params, jax.tree.map(jnp.asarray, mb), loss_cfg, 8)
  mesh = make_mesh((8, 1, 1))
  with jax.set_mesh(mesh):
    batch = distributed.grouped_global_batch(mb.replace(grouped=True), mesh, 2)
    assert batch.resp_BR.shape == (2, 8, 5) and batch.resp_BR.addressable_shards[0].data.shape == (2, 1, 5)
    grouped, _ = _step(spec, params, batch, loss_cfg, 8)
  _assert_trees_close(grouped.params, flat.params, 1e-6)


@pytest.mark.parametrize("storage", ["cpu", "accelerator"])
def test_bf16_update_keeps_fp32_master_weights_and_matches_fp32(storage, monkeypatch):
  """learner.dtype='bfloat16': bf16 matmuls, fp32 master weights, norms, softmax and loss. One step's loss and
  every parameter's change agree with the fp32 step to bf16 rounding (8 mantissa bits: ~4e-3 relative per
  product, compounded over the layers and the backward's near-cancelling sums; measured at most 9e-3 here),
  leaf by leaf: an aggregate over all parameters would hide a weight whose gradient the bf16 cast lost (the
  embeddings' changes dominate it). The state stays fp32. "accelerator": bf16 kept as bf16, not as uint16 bits
  (xla_cpu.storage_dtype off CPU), so the weights are cast before the layer scan, as on a TPU or GPU."""
  if storage == "accelerator":
    monkeypatch.setattr(xla_cpu, "storage_dtype", lambda dtype: dtype)
  spec, params, mb = _tiny_batch()
  # A new function, so a fresh trace: the layer scan takes the fp32 weights on CPU, bf16 ones on an accelerator.
  fwd = lambda p: tf.forward(p, spec, mb.prompt_BP, tf.left_pad_positions(mb.pvalid_BP),
                             mb.pvalid_BP.astype(jnp.int32), dtype=jnp.bfloat16)[0]
  layer_scan = next(e for e in jax.make_jaxpr(fwd)(params).jaxpr.eqns if e.primitive.name == "scan")
  weights_in = {v.aval.dtype for v in layer_scan.invars if v.aval.ndim >= 3 and v.aval.shape[0] == spec.n_layers}
  assert weights_in == {jnp.dtype(jnp.bfloat16 if storage == "accelerator" else jnp.float32)}
  loss_cfg = _loss(opd_variant="gated", opd_coef=0.5, entropy_coef=0.01, kl_coef=0.1)
  opt = optax.sgd(1.0)
  out = {}
  for name, dtype in (("fp32", jnp.float32), ("bf16", jnp.bfloat16)):
    fn = update_lib.make_update_fn(spec, loss_cfg, opt, micro_batch_size=2, dtype=dtype, chunk=4, remat=True)
    out[name] = fn(update_lib.init_state(jax.tree.map(jnp.copy, params), opt), mb, jnp.float32(1.0))
  (s32, m32), (s16, m16) = out["fp32"], out["bf16"]
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(s16.params)) and m16["loss"].dtype == jnp.float32
  change = lambda s: {jax.tree_util.keystr(k): np.asarray(x) - np.asarray(p) for (k, x), p in
                      zip(jax.tree_util.tree_leaves_with_path(s.params), jax.tree.leaves(params))}
  d32, d16 = change(s32), change(s16)
  rel = {k: float(np.linalg.norm(d16[k] - d32[k]) / np.linalg.norm(d32[k])) for k in d32}
  loss_rel = abs(float(m16["loss"]) - float(m32["loss"])) / abs(float(m32["loss"]))
  print(f"bf16 vs fp32: loss {loss_rel:.1e}, parameter change per leaf (relative) {rel}")
  assert all(np.linalg.norm(d) > 1e-6 for d in d32.values()) and loss_rel < 1e-3
  assert max(rel.values()) < 5e-2, rel  # every leaf, the layers' projections included, moved as in fp32
  assert max(rel.values()) > 1e-5  # bf16 really computed: the fp32 and bf16 steps are not the same program
