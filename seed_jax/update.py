"""The optax train step: micro-batch gradient accumulation of the SEED loss, AdamW, non-finite guard.

`make_update_fn` returns one jitted function `(state, minibatch, temperature) -> (state, metric sums)` that
scans over micro-batches, adds their gradients (each micro-batch loss is already divided by the whole
mini-batch's normalizer, so the sum is exact), clips, applies AdamW, and skips the update if the loss or the
gradient norm is not finite.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from seed_jax import losses
from seed_jax.config import check_choice
from seed_jax.batch import MiniBatch
from seed_jax.models.logprobs import packed_logprobs, response_logprobs
from seed_jax.models.spec import ModelSpec


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # optimizer steps taken
  params: Any
  opt_state: Any
  skipped: jax.Array  # optimizer steps skipped because the loss or gradient was not finite


@dataclasses.dataclass(frozen=True)
class TeacherPlan:
  """Where the skill-context log-probs (the OPD teacher) come from, and the update layout that allows.
  teacher="old": π_old at re-score time, so the re-scorer scores H(h, s) next to the ordinary prompts;
  "current": π_θ in the update (stop-gradient), so the mini-batches carry the H(h, s) prompts and each
  micro-batch scores both contexts in one forward, in the padded layout."""
  rescore_skill_prompts: bool
  update_reads_skill_prompts: bool
  update_pack_length: int = 0  # the update's packed row length (learner.pack_length); 0: padded rows


def teacher_plan(loss_cfg: losses.SeedLossConfig, teacher: str, *, images: bool = False,
                 pack_length: int = 0) -> TeacherPlan:
  """The one place `learner.teacher` is read and checked against the layout: image observations (`images`)
  take teacher "old" only; packed update rows (`pack_length` > 0) serve a teacher that does not score H(h, s)
  in the update, which otherwise gets padded rows. Without a skill term neither side looks at H(h, s)."""
  check_choice("learner.teacher", teacher)
  if images and teacher != "old":
    raise ValueError("config.env.observation='image' serves config.learner.teacher='old' only")
  reads = loss_cfg.uses_skill and teacher == "current"
  return TeacherPlan(rescore_skill_prompts=loss_cfg.uses_skill and teacher == "old", update_reads_skill_prompts=reads,
                     update_pack_length=0 if reads else max(pack_length, 0))


def make_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """AdamW after global-norm clipping. Schedules: "constant"; "warmup_cosine" over cfg.total_steps optimizer
  steps; "warmup_constant": the learning rate lives in the optimizer state and RL sets it once per update
  (`with_update_lr`), as the reference's per-iteration scheduler does."""
  adamw = optax.adamw
  if cfg.schedule == "constant":
    lr = cfg.lr
  elif cfg.schedule == "warmup_cosine":
    if cfg.total_steps <= 0:
      raise ValueError("update.total_steps must be > 0 for schedule 'warmup_cosine'")
    warm = int(cfg.warmup_frac * cfg.total_steps)
    lr = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, max(warm, 1), max(cfg.total_steps, warm + 1))
  elif cfg.schedule == "warmup_constant":
    lr, adamw = cfg.lr, optax.inject_hyperparams(optax.adamw)
  else:
    raise ValueError(f"update.schedule must be 'constant', 'warmup_cosine' or 'warmup_constant', got {cfg.schedule!r}")
  return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                     adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay))


def update_lr(cfg: ml_collections.ConfigDict, u: int, num_updates: int) -> float:
  """Learning rate of RL update u (0-based) under "warmup_constant": linear from 0 over the first
  int(warmup_frac x num_updates) updates, then cfg.lr (verl's constant-with-warmup: update 0 has lr 0)."""
  warm = int(cfg.warmup_frac * num_updates)
  return cfg.lr * min(1.0, u / warm) if warm > 0 else cfg.lr


def with_update_lr(state: TrainState, lr: float) -> TrainState:
  """`state` with the learning rate of a "warmup_constant" optimizer set to `lr` (same dtype and sharding)."""
  clip_state, adam_state = state.opt_state
  old = adam_state.hyperparams["learning_rate"]
  new = jax.device_put(jnp.asarray(lr, old.dtype), getattr(old, "sharding", None))
  hyper = dict(adam_state.hyperparams, learning_rate=new)
  return state.replace(opt_state=(clip_state, adam_state._replace(hyperparams=hyper)))


def state_shardings(params, optimizer: optax.GradientTransformation) -> TrainState | None:
  """Shardings of `init_state(params, optimizer)` for params placed with NamedShardings (None otherwise):
  every optimizer leaf that mirrors a parameter (AdamW's moments) takes that parameter's sharding, so the
  optimizer state is as fully sharded as the weights; counters are replicated on the same mesh."""
  shardings = jax.tree.map(lambda p: getattr(p, "sharding", None), params)
  leaves = jax.tree.leaves(shardings)
  if not leaves or not all(isinstance(s, NamedSharding) for s in leaves):
    return None
  replicated = NamedSharding(leaves[0].mesh, P())
  opt = optax.tree_map_params(optimizer, lambda _, s: s, jax.eval_shape(optimizer.init, params), shardings,
                              transform_non_params=lambda _: replicated)
  return TrainState(step=replicated, params=shardings, opt_state=opt, skipped=replicated)


def init_state(params, optimizer: optax.GradientTransformation) -> TrainState:
  """Fresh train state holding `params` (not copied); with sharded params the optimizer state is created
  directly on `state_shardings`."""
  shardings = state_shardings(params, optimizer)
  if shardings is None:
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                      skipped=jnp.zeros((), jnp.int32))
  zero = lambda s: jax.device_put(jnp.zeros((), jnp.int32), s)
  opt_state = jax.jit(optimizer.init, out_shardings=shardings.opt_state)(params)
  return TrainState(step=zero(shardings.step), params=params, opt_state=opt_state, skipped=zero(shardings.skipped))


def micro_loss(params, mb: MiniBatch, norm: losses.LossNormalizers, temperature, *, spec: ModelSpec,
               loss_cfg: losses.SeedLossConfig, dtype, chunk: int, remat: bool | str, teacher: TeacherPlan):
  """SEED loss of one micro-batch. With teacher="current" both contexts go through one forward and the
  skill-side log-probs are stop-gradient teachers."""
  B = mb.resp_BR.shape[0]
  kw = dict(dtype=dtype, chunk=chunk, remat=remat, with_entropy=loss_cfg.entropy_coef != 0)
  fwd = lambda pr, pv, rs, rm: response_logprobs(params, spec, pr, pv, rs, rm, temperature, **kw)
  skill_logp = mb.skill_logp_BR
  if mb.packed is not None:
    logp, ent = packed_logprobs(params, spec, mb.packed, mb.resp_BR, mb.rmask_BR, temperature, mb.images, **kw)
  elif teacher.update_reads_skill_prompts:
    both = lambda a, b: jnp.concatenate([a, b], axis=0)
    logp2, ent2 = fwd(both(mb.prompt_BP, mb.skill_prompt_BP), both(mb.pvalid_BP, mb.skill_pvalid_BP),
                      both(mb.resp_BR, mb.resp_BR), both(mb.rmask_BR, mb.rmask_BR))
    logp, ent, skill_logp = logp2[:B], ent2[:B], jax.lax.stop_gradient(logp2[B:])
  else:
    logp, ent = response_logprobs(params, spec, mb.prompt_BP, mb.pvalid_BP, mb.resp_BR, mb.rmask_BR, temperature,
                                  mb.images, **kw)
  # No π_old columns: this step is the update's only one, so π_old is π_θ here (pipeline.old_logps_source), and
  # without skills this update its log-probs stand in for the masked-out skill side too.
  old_logp = mb.old_logp_BR
  if old_logp is None:
    old_logp = jax.lax.stop_gradient(logp)
    skill_logp = old_logp if skill_logp is None else skill_logp
  return losses.seed_loss(
      logp, old_logp_BT=old_logp, adv=mb.adv_B, mask_BT=mb.rmask_BR, norm=norm, cfg=loss_cfg,
      entropy_BT=ent if loss_cfg.entropy_coef else None, ref_logp_BT=mb.ref_logp_BR if loss_cfg.kl_coef else None,
      skill_logp_BT=skill_logp if loss_cfg.uses_skill else None,
      opd_mask_B=mb.opd_mask_B if loss_cfg.uses_skill else None)


def make_update_fn(spec: ModelSpec, loss_cfg: losses.SeedLossConfig, optimizer: optax.GradientTransformation,
                   *, micro_batch_size: int, dtype=jnp.float32, chunk: int = 128, remat: bool | str = True,
                   teacher: TeacherPlan | None = None, state_shardings: TrainState | None = None) -> Callable:
  """Jitted `(state, minibatch, temperature) -> (state, metric sums)`; the state is donated. `teacher`: the
  run's teacher_plan (None: teacher "old"). `state_shardings` (from `state_shardings(params, optimizer)`) pins
  the new state to exactly the input layout, so the donated buffers are reused and the next call does not
  recompile for a respelled sharding."""
  teacher = teacher_plan(loss_cfg, "old") if teacher is None else teacher
  loss_fn = jax.value_and_grad(
      lambda p, mb, norm, temp: micro_loss(p, mb, norm, temp, spec=spec, loss_cfg=loss_cfg, dtype=dtype,
                                           chunk=chunk, remat=remat, teacher=teacher), has_aux=True)

  def update(state: TrainState, batch: MiniBatch, temperature):
    if batch.grouped:  # leaves [micro-batches, rows, ...] already (distributed.grouped_global_batch)
      micro, batch = batch, jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), batch)
    else:
      M = batch.resp_BR.shape[0]
      if batch.micro_batches:  # packed: rows and slots are already grouped per micro-batch
        n_micro = batch.micro_batches
      elif M % micro_batch_size:
        raise ValueError(f"mini-batch of {M} rows is not a multiple of micro_batch_size={micro_batch_size}")
      else:
        n_micro = M // micro_batch_size
      micro = jax.tree.map(lambda x: x.reshape((n_micro, x.shape[0] // n_micro) + x.shape[1:]), batch)
    norm = losses.loss_normalizers(batch.rmask_BR, batch.opd_mask_B if loss_cfg.uses_skill else None,
                                   loss_cfg.agg_mode)
    first = jax.tree.map(lambda x: x[0], micro)
    (_, metrics_shape), _ = jax.eval_shape(loss_fn, state.params, first, norm, temperature)
    zeros = lambda t: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), t)

    def body(carry, mb):
      grads, sums = carry

      def run(_):
        (_, metrics), g = loss_fn(state.params, mb, norm, temperature)
        return g, metrics

      # A micro-batch without response tokens (bucket padding) adds exactly nothing: skip its forward/backward.
      g, metrics = jax.lax.cond(jnp.any(mb.rmask_BR), run, lambda _: (zeros(state.params), zeros(metrics_shape)),
                                None)
      return (jax.tree.map(jnp.add, grads, g), losses.accumulate_metrics(sums, metrics)), None

    (grads, sums), _ = jax.lax.scan(body, (zeros(state.params), zeros(metrics_shape)), micro)
    grad_norm = optax.tree.norm(grads)
    ok = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)

    def apply(s: TrainState) -> TrainState:
      updates, opt_state = optimizer.update(grads, s.opt_state, s.params)
      return s.replace(step=s.step + 1, params=optax.apply_updates(s.params, updates), opt_state=opt_state)

    new_state = jax.lax.cond(ok, apply, lambda s: s.replace(skipped=s.skipped + 1), state)
    return new_state, dict(sums, grad_norm=grad_norm, update_skipped=(~ok).astype(jnp.float32))

  out = None if state_shardings is None else (state_shardings, None)  # metrics: replicated
  return jax.jit(update, donate_argnums=0, out_shardings=out)
