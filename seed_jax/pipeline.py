"""One SEED update (rollout -> self-analysis -> dual-context re-score -> advantages -> PPO epochs), the
evaluation loop, and the resumable training loop around them."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from seed_jax import batch as batch_lib
from seed_jax import advantages, analyzers, images, losses, packing, shares, skills
from seed_jax import plan as plan_lib
from seed_jax import update as update_lib
from seed_jax.buckets import CompileCounter, TokenCount, bucket, pow2_sizes
from seed_jax.envs import get_family
from seed_jax.envs.base import Task, Trajectory
from seed_jax.envs.pool import EnvPool
from seed_jax.infra import checkpoint as ckpt_lib
from seed_jax.infra import distributed
from seed_jax.infra import mesh as mesh_lib
from seed_jax.infra import preflight
from seed_jax.infra import stop as stop_lib
from seed_jax.infra.metrics import MetricsWriter
from seed_jax.models import tokenizer as tokenizer_lib
from seed_jax.models import weights
from seed_jax.rescore import Rescorer, RescorerConfig
from seed_jax.rollout import run_episodes
from seed_jax.sample import Sampler, SamplerConfig, SamplingParams

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Runtime:
  """Everything built once per run from the config."""
  cfg: ml_collections.ConfigDict
  mesh: Any
  spec: Any
  tokenizer: tokenizer_lib.Tokenizer
  family: Any
  pool: EnvPool
  sampler: Sampler
  rescorer: Rescorer
  update_fn: Any
  optimizer: Any
  loss_cfg: losses.SeedLossConfig
  teacher: update_lib.TeacherPlan
  init_params: Any  # also the frozen KL reference
  train_tasks: list[Task]
  eval_tasks: dict[str, list[Task]]  # split -> its fixed panel
  stop_sequences: list[list[int]]
  update_compiles: CompileCounter = dataclasses.field(default_factory=CompileCounter)
  codec: images.ImageCodec | None = None  # a vision-language policy's image side (None: text-only)

  def close(self):
    self.pool.close()


def effective_loss_config(cfg: ml_collections.ConfigDict) -> losses.SeedLossConfig:
  """The loss settings; with the analyzer off there is no skill signal: plain GRPO on the same code path."""
  loss_cfg = losses.SeedLossConfig.from_config(cfg.objectives)
  if not cfg.analyzer.enabled and loss_cfg.uses_skill:
    loss_cfg = dataclasses.replace(loss_cfg, opd_variant="none")
  return loss_cfg


def build(cfg: ml_collections.ConfigDict) -> Runtime:
  multi = distributed.initialize(cfg.distributed)  # [scale] joins a multi-process job before any device use
  image_obs = cfg.env.get("observation", "text") == "image"
  if multi and image_obs:
    raise distributed.SetupError(f"config.env.observation='image' runs on one process, this job has "
                                 f"{jax.process_count()}")
  if image_obs and not weights.is_vision_language(cfg.model.path):
    raise ValueError(f"config.env.observation='image' needs a vision-language (Qwen2.5-VL) checkpoint, but "
                     f"config.model.path={cfg.model.path!r} is text-only: set config.env.observation='text' or "
                     f"point config.model.path at a Qwen2.5-VL folder (or 'embedded-vl')")
  if image_obs and cfg.learner.teacher != "old":
    raise ValueError("config.env.observation='image' serves config.learner.teacher='old' only")
  mesh = mesh_lib.mesh_from_config(cfg.mesh)  # [scale] presets, multi-slice, TPU device order
  if multi:  # each process supplies the rows of its own environments
    distributed.check_row_split(mesh)
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    if cfg.learner.micro_batch_size % dp:
      raise distributed.SetupError(
          f"config.learner.micro_batch_size={cfg.learner.micro_batch_size} does not divide over data x fsdp = "
          f"{dp} devices of {jax.process_count()} processes: make it a multiple of {dp}")
  spec, params = weights.load_model(cfg.model.path, mesh)
  spec = spec.with_attention(cfg.model)
  tok = tokenizer_lib.load_tokenizer(cfg.model.tokenizer or cfg.model.path)
  codec = None
  if spec.vision is not None:  # the checkpoint's processor bounds and vision tokens
    codec = images.ImageCodec.from_folder(weights.resolve_path(cfg.model.path))
    tok = images.VLTokenizer(tok, codec)
  family = get_family(cfg.env.name)
  max_prompt = max(cfg.model.max_prompt_tokens, cfg.analyzer.max_prompt_tokens if cfg.analyzer.enabled else 0)
  max_batch, max_rows = auto_rows(cfg, spec, mesh)
  sampler = Sampler(spec, tok.eos_ids, SamplerConfig(max_prompt_len=max_prompt, max_batch=max_batch,
                                                     dtype=cfg.sampler.dtype,
                                                     prefill_chunk=cfg.sampler.prefill_chunk), mesh, codec)
  rescorer = Rescorer(spec, tok.pad_id, RescorerConfig(
      max_rows=max_rows, max_prompt_len=cfg.model.max_prompt_tokens,
      max_response_len=cfg.rollout.max_new_tokens, vocab_chunk=cfg.rescore.vocab_chunk, dtype=cfg.rescore.dtype,
      pack_length=cfg.rescore.pack_length, pack_tokens=cfg.rescore.pack_tokens), mesh, codec)
  loss_cfg = effective_loss_config(cfg)
  optimizer = update_lib.make_optimizer(cfg.learner)
  update_fn = update_lib.make_update_fn(
      spec, loss_cfg, optimizer, micro_batch_size=cfg.learner.micro_batch_size, dtype=jnp.dtype(cfg.learner.dtype),
      chunk=cfg.rescore.vocab_chunk, remat=cfg.learner.remat, teacher=cfg.learner.teacher,
      state_shardings=update_lib.state_shardings(params, optimizer))  # [scale] the state keeps its layout
  procs = jax.process_count()  # [scale] each process's pool holds its share of the groups and eval episodes
  n_envs = max(-(-cfg.rollout.tasks_per_update // procs) * cfg.rollout.group_size, -(-eval_chunk(cfg) // procs))
  pool = EnvPool(family, cfg.env, n_envs)
  return Runtime(cfg=cfg, mesh=mesh, spec=spec, tokenizer=tok, family=family, pool=pool, sampler=sampler,
                 rescorer=rescorer, update_fn=update_fn, optimizer=optimizer, loss_cfg=loss_cfg,
                 teacher=update_lib.teacher_plan(loss_cfg, cfg.learner.teacher), init_params=params,
                 train_tasks=family.tasks(cfg.env, cfg.env.train_split),
                 eval_tasks={s: spread(family.tasks(cfg.env, s), cfg.eval.max_tasks)
                             for s in cfg.eval.split.split(",") if s},
                 stop_sequences=[tok.encode(s) for s in cfg.rollout.stop_strings], codec=codec)


def eval_chunk(cfg: ml_collections.ConfigDict) -> int:
  """Panel episodes played at once (over all processes): one update's episodes or eval.batch_envs."""
  return max(cfg.rollout.tasks_per_update * cfg.rollout.group_size, cfg.eval.batch_envs)


def auto_rows(cfg: ml_collections.ConfigDict, spec, mesh) -> tuple[int, int]:
  """(sampler.max_batch, rescore.max_rows), each 0 ("auto") replaced by the largest power of two the planner
  fits in this device's memory (plan.fitting_rows)."""
  out = []
  for field in ("sampler.max_batch", "rescore.max_rows"):
    a, b = field.split(".")
    rows = cfg[a][b]
    if not rows:
      rows = plan_lib.fitting_rows(cfg, spec, dict(mesh.shape), plan_lib.device_memory_bytes(), field)
      log.info("%s = auto: %d rows fit", field, rows)
    out.append(rows)
  return out[0], out[1]


def spread(tasks: Sequence[Task], n: int) -> list[Task]:
  """`n` tasks evenly spaced over a panel (panels are ordered by family), or all of them for n = 0."""
  if not n or n >= len(tasks):
    return list(tasks)
  return [tasks[i] for i in np.linspace(0, len(tasks) - 1, n).round().astype(int)]


def tasks_for_update(tasks: Sequence[Task], u: int, per_update: int, seed: int) -> list[Task]:
  """Deterministic task stream: epoch e visits the training tasks in permutation(seed, e)."""
  out = []
  for k in range(u * per_update, (u + 1) * per_update):
    epoch, pos = divmod(k, len(tasks))
    out.append(tasks[np.random.default_rng([seed, epoch]).permutation(len(tasks))[pos]])
  return out


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


def analysis_active(cfg, u: int) -> bool:
  a = cfg.analyzer
  return bool(a.enabled) and u >= a.start_update and (a.stop_update < 0 or u < a.stop_update)


def rl_update(rt: Runtime, state: update_lib.TrainState, u: int, writer: MetricsWriter,
              check: Callable[[], None] = lambda: None) -> tuple[Any, dict]:
  """One SEED update: rollout -> analyze -> collect -> re-score -> advantages -> PPO -> report. `check` runs
  before each phase up to the PPO step and may raise to end the update there (the state is then unchanged):
  a requested stop, a failed checkpoint write."""
  cfg = rt.cfg
  key = jax.random.fold_in(jax.random.key(cfg.seed), u)
  timer = writer.phase_timer()
  tokens: dict[str, TokenCount] = {}  # per phase; rollout and analysis share the sampler's counter
  before, clock = rt.sampler.tokens.copy(), {}
  check()
  with timer.phase("rollout"), sampler_times(rt.sampler, clock):
    trajs = _rollout(rt, state.params, u, jax.random.fold_in(key, 0), clock)
  tokens["rollout"] = rt.sampler.tokens - before
  good = [t for t in trajs if t.termination != "env_error"]  # this process's
  everyone = shares.gather_trajectories(trajs)  # [scale] metrics and dumps are over every process's episodes
  metrics = rollout_metrics(everyone, "rollout")
  metrics.update({f"time/rollout_{k}": v for k, v in clock.items()})
  if not any(t.steps for t in everyone if t.termination != "env_error"):
    log.warning("update %d: no usable step-samples (all episodes failed to start); skipping", u)
    return state, metrics
  analysis = None
  if analysis_active(cfg, u):
    before, clock = rt.sampler.tokens.copy(), {}
    check()
    with timer.phase("analysis"), sampler_times(rt.sampler, clock):
      analysis = _analyze(rt, state.params, good, jax.random.fold_in(key, 1))
    tokens["analysis"] = rt.sampler.tokens - before
    metrics.update({f"time/analysis_{k}": v for k, v in clock.items()})
    records = shares.gather_records(_skill_records(good, analysis))
    metrics["analysis/parse_rate"] = float(np.mean([r["ok"] for r in records])) if records else 0.0
    metrics["analysis/salvaged_rate"] = float(np.mean([r["salvaged"] for r in records])) if records else 0.0
    writer.dump_jsonl("skills", u, records)
  samples = batch_lib.collect_samples(good, None if analysis is None else analysis.skills, rt.tokenizer,
                                      cfg.model.max_prompt_tokens)
  before = rt.rescorer.tokens.copy()
  check()
  with timer.phase("rescore"):
    old_logp, skill_logp, ref_logp = _rescore(rt, state.params, samples, with_skills=analysis is not None)
  tokens["rescore"] = rt.rescorer.tokens - before
  adv_N = advantages.compute_advantages(advantages.StepSamples.from_trajectories(good), cfg.objectives)
  metrics.update(advantage_metrics(shares.gather_concat(adv_N)))  # groups are host-local: no gather needed above
  metrics["rescore/old_logps_from_sampler"] = float(old_logps_from_sampler(cfg))
  # Without skills this update (analysis off or outside its window) the OPD mask is all False: its term is 0
  # and the same compiled update serves.
  check()
  with timer.phase("update"):
    if cfg.learner.schedule == "warmup_constant":
      lr = update_lib.update_lr(cfg.learner, u, cfg.train.num_updates)
      state, metrics["update/lr"] = update_lib.with_update_lr(state, lr), lr
    state, upd, tokens["update"] = _ppo_epochs(rt, state, samples, shares.step_keys(good), adv_N, old_logp,
                                               ref_logp, skill_logp, key)
  metrics.update(upd)
  metrics.update(_report(rt, everyone, samples, timer.pop(), shares.gather_tokens(tokens)))
  writer.dump_jsonl("trajectories", u, [_traj_record(t) for t in everyone[:cfg.train.dump_trajectories]])
  return state, metrics


@contextlib.contextmanager
def sampler_times(sampler: Sampler, clock: dict[str, float]):
  """Adds the sampler's prefill and decode seconds spent inside the block to `clock` (prefill_s, decode_s)."""
  before = dict(sampler.times)
  yield
  clock.update({k: sampler.times[k] - before[k] for k in before})


def _rollout(rt: Runtime, params, u: int, key, clock: dict[str, float] | None = None) -> list[Trajectory]:
  """group_size rollouts of each of update u's tasks with the current weights: this process's share of the
  tasks (shares.my_tasks), each episode drawing as the b * G + g-th of the update."""
  cfg = rt.cfg
  G = cfg.rollout.group_size
  tasks = tasks_for_update(rt.train_tasks, u, cfg.rollout.tasks_per_update, cfg.seed)
  mine = [(b, g) for b in shares.my_tasks(len(tasks)) for g in range(G)]
  sp = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_k, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
  return run_episodes(rt.pool, rt.family, cfg.env, [tasks[b] for b, _ in mine], [u * len(tasks) + b for b, _ in mine],
                      [g for _, g in mine], rt.sampler.rollout_fn(params, sp, rt.stop_sequences),
                      rt.tokenizer, key, max_prompt_tokens=cfg.model.max_prompt_tokens, clock=clock,
                      episode_ids=[b * G + g for b, g in mine])


def _analyze(rt: Runtime, params, trajs: Sequence[Trajectory], key) -> skills.Analysis:
  """A hindsight skill per trajectory; the policy backend decodes greedily with the current weights."""
  ac = rt.cfg.analyzer
  sp = SamplingParams(temperature=0.0, max_new_tokens=ac.max_new_tokens)
  analyzer = analyzers.make_analyzer(ac, lambda texts: rt.sampler.generate_text(params, texts, key, sp, rt.tokenizer))
  return skills.analyze_trajectories(analyzer, trajs, ac, count_tokens=lambda s: len(rt.tokenizer.encode_chat(s)))


def old_logps_from_sampler(cfg: ml_collections.ConfigDict) -> bool:
  """Whether π_old's log-probs are the sampler's own: with fp32 sampling and fp32 scoring at the same (non-zero)
  rollout temperature they are the numbers a re-score would compute (tests hold them equal within 1e-5), so
  the ordinary context needs no second forward. rescore.old_logps="rescore" always re-scores."""
  return (cfg.rescore.old_logps == "auto" and cfg.sampler.dtype == "float32" and cfg.rescore.dtype == "float32"
          and cfg.rollout.temperature > 0)


def _rescore(rt: Runtime, params, samples: batch_lib.Samples, with_skills: bool):
  """(π_old, skill-context, reference) log-probs per sample. π_old's come from the sampler where they are the
  same numbers (old_logps_from_sampler), else from re-scoring the ordinary context. The skill context is
  re-scored only when the teacher is π_old and this update has skills; otherwise the π_old log-probs stand in
  (the OPD mask is all False, or the update scores H(h, s) with π_θ itself). The reference is None without a
  KL term."""
  cfg = rt.cfg
  reuse = old_logps_from_sampler(cfg)
  # No row with a skill (every analysis failed): H(h, s) is the ordinary prompt and the OPD mask is all False.
  with_skills = with_skills and distributed.any_process(samples.opd_mask_N.any())  # [scale] the same passes everywhere
  skill_ctx = [samples.skill_prompts] if with_skills and rt.teacher.rescore_skill_prompts else []
  contexts = ([] if reuse else [samples.prompts]) + skill_ctx
  lp = rt.rescorer.score(params, contexts, samples.responses, cfg.rollout.temperature,
                         images=samples.images)[0] if contexts else []
  old = [np.asarray(x, np.float32) for x in samples.sampled_logps] if reuse else lp[0]
  ref = None
  if rt.loss_cfg.kl_coef:
    ref_params = mesh_lib.with_memory_kind(rt.init_params, "device")  # [scale] no-op unless kept in host RAM
    ref = rt.rescorer.score(ref_params, [samples.prompts], samples.responses, cfg.rollout.temperature,
                            images=samples.images)[0][0]
  return old, lp[-1] if skill_ctx else old, ref


def advantage_metrics(adv_N: np.ndarray) -> dict[str, float]:
  """How much learning signal the update carries: all zeros means every step-sample scored the same."""
  a = np.abs(np.asarray(adv_N, np.float64))
  return {"advantages/abs_mean": float(a.mean()) if a.size else 0.0,
          "advantages/nonzero_frac": float((a > 1e-8).mean()) if a.size else 0.0}


def _skill_records(trajs: Sequence[Trajectory], analysis: skills.Analysis) -> list[dict]:
  return [dict(task=t.task.task_id, group=t.group_id, traj=t.traj_id, success=t.success, ok=p.ok, skill=p.skill,
               summary=p.summary, error=p.error, reply=r, salvaged=p.salvaged)
          for t, p, r in zip(trajs, analysis.parses, analysis.replies)]


def _report(rt: Runtime, trajs: Sequence[Trajectory], samples: batch_lib.Samples, times: dict[str, float],
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
  for phase in ("rollout", "analysis", "rescore", "update"):
    m.update(tokens.get(phase, TokenCount()).metrics(f"tokens/{phase}"))
  return m


def _ppo_epochs(rt: Runtime, state, samples, keys, adv_N, old_logp, ref_logp, skill_logp, key):
  """ppo_epochs passes over shuffled mini-batches; update/* metrics are means over the optimizer steps. Also
  returns the token positions the steps computed (padded: rows x (Pn + R) per step, both contexts with teacher
  "current"; packed: the packed rows) against the real rows' prompt and response lengths.

  `keys` (shares.step_keys) place this process's samples in the canonical order the mini-batches are drawn
  over; each process lays out its members of a mini-batch (shapes agreed over processes) as its share of every
  micro-batch (distributed.grouped_global_batch)."""
  cfg = rt.cfg
  micro, procs = cfg.learner.micro_batch_size, jax.process_count()
  micro_l = max(1, micro // procs)  # this process's rows of a padded micro-batch
  skill_prompts = rt.teacher.update_reads_skill_prompts
  pack = cfg.learner.pack_length > 0 and not skill_prompts  # teacher "current" scores both contexts in the padded layout
  Pn, R, R_pack = distributed.agree_max(*batch_lib.shapes_for(samples, with_skill=skill_prompts), bucket(
      max(map(len, samples.responses), default=1), pow2_sizes(16, max(16, cfg.rollout.max_new_tokens)),
      "response length"))
  draw = shares.MinibatchDraw(keys)
  per = min(cfg.learner.minibatch_size, draw.total)
  sums_all: dict[str, float] = {}
  rng = np.random.default_rng(np.asarray(jax.random.key_data(jax.random.fold_in(key, 2))).ravel().tolist())
  n_steps = 0
  tokens = TokenCount()
  for idx in draw.minibatches(rng, per, cfg.learner.ppo_epochs):
    if pack:
      layout = packing.plan_layout([len(samples.prompts[i]) + len(samples.responses[i]) for i in idx],
                                   length=cfg.learner.pack_length, group_tokens=micro * (Pn + R) // procs,
                                   row_multiple=distributed.local_dp(rt.mesh))
      G, W, S, L = distributed.agree_max(len(layout.groups), layout.rows_per_group, layout.slots_per_group,
                                         layout.length)
      layout = packing.resized(layout, L, G, W, S)
      mb, t = batch_lib.packed_minibatch(samples, idx, layout, R_pack, adv_N=adv_N, old_logp=old_logp,
                                         ref_logp=ref_logp, skill_logp=skill_logp, codec=rt.codec)
      r0 = distributed.row_block(rt.mesh, W * procs)[0]  # this process's first row of each micro-batch
      mb = mb.replace(packed=mb.packed.replace(row_S=mb.packed.row_S + r0))
      shape = ("packed", G, W, L, S, R_pack)
    else:
      # Padded to a power-of-two count of micro-batches, at least the count one process would use.
      (n,) = distributed.agree_max(max(len(idx), -(-per // procs)))
      rows = micro_l * (1 << (-(-n // micro_l) - 1).bit_length())
      G = rows // micro_l
      mb = batch_lib.minibatch(samples, idx, rows, Pn, R, rt.tokenizer.pad_id, adv_N=adv_N,
                               old_logp=old_logp, ref_logp=ref_logp, skill_logp=skill_logp,
                               with_skill_prompts=skill_prompts, codec=rt.codec, micro_batch_size=micro_l)
      t = batch_lib.minibatch_tokens(samples, idx, rows, Pn, R, with_skill_prompts=skill_prompts)
      shape = ("padded", rows, Pn, R, skill_prompts)
    tokens.add(t)
    shape += (0 if mb.images is None else mb.images.pixels_NP.shape[0],)  # image patches
    if rt.update_compiles.see(shape + (ref_logp is None, skill_logp is None)):
      log.info("compiling update: %s", " x ".join(map(str, shape)))
    with jax.set_mesh(rt.mesh):  # [scale] every micro-batch's rows over the data-parallel axes, as global arrays
      batch = distributed.grouped_global_batch(mb.replace(grouped=True), rt.mesh, G)
      state, sums = rt.update_fn(state, batch, jnp.float32(cfg.rollout.temperature))
    for k, v in losses.finalize_metrics(jax.device_get(sums)).items():
      sums_all[k] = sums_all.get(k, 0.0) + float(v)
    n_steps += 1
  out = {f"update/{k}": v / max(n_steps, 1) for k, v in sums_all.items()}
  out["update/optimizer_steps"] = n_steps
  out["update/skipped_total"] = int(state.skipped)
  return state, out, tokens


def _traj_record(t: Trajectory) -> dict:
  return dict(task=t.task.to_json(), group=t.group_id, traj=t.traj_id, ret=t.episode_return, success=t.success,
              termination=t.termination, steps=[dict(observation=s.observation, response=s.response_text,
                                                     action=s.action, valid=s.action_valid, reward=s.reward)
                                                for s in t.steps])


def eval_chunks(rt: Runtime, params, key, skip: Callable[[str, int], bool] = lambda split, c: False):
  """Plays the fixed panels chunk by chunk (eval_chunk episodes at once) with the plain policy (ordinary
  prompts, no skills, eval temperature): yields (split, chunk index, trajectories). Chunk c of split i always
  draws from key folded with (i, c), so a resumed evaluation that `skip`s finished chunks plays the rest exactly
  as an uninterrupted one. With several processes each plays its share of a chunk; every process gets all of
  its trajectories (shares.gather_trajectories)."""
  cfg = rt.cfg
  sp = SamplingParams(cfg.eval.temperature, 0, 1.0, cfg.rollout.max_new_tokens)
  n = eval_chunk(cfg)
  for i, (split, tasks) in enumerate(rt.eval_tasks.items()):
    for c, start in enumerate(range(0, len(tasks), n)):
      if skip(split, c):
        continue
      mine = [start + j for j in shares.my_tasks(min(n, len(tasks) - start))]
      trajs = run_episodes(rt.pool, rt.family, cfg.env, [tasks[k] for k in mine], mine, [0] * len(mine),
                           rt.sampler.rollout_fn(params, sp, rt.stop_sequences), rt.tokenizer,
                           jax.random.fold_in(jax.random.fold_in(key, i), c),
                           max_prompt_tokens=cfg.model.max_prompt_tokens, episode_ids=[k - start for k in mine])
      yield split, c, shares.gather_trajectories(trajs)


def family_success(trajs: Sequence[Trajectory]) -> dict[str, float]:
  """Success rate per task family ("all" when the benchmark has none); env errors are left out."""
  out = {}
  for fam in sorted({t.task.family for t in trajs}):
    ok = [t.success for t in trajs if t.task.family == fam and t.termination != "env_error"]
    out[fam or "all"] = float(np.mean(ok)) if ok else 0.0
  return out


def evaluate(rt: Runtime, params, key) -> dict[str, float]:
  """eval/<split>/* rollout metrics and eval/<split>/success/<family> over every panel."""
  by_split: dict[str, list[Trajectory]] = {s: [] for s in rt.eval_tasks}
  for split, _, trajs in eval_chunks(rt, params, key):
    by_split[split] += trajs
  m: dict[str, float] = {}
  for split, trajs in by_split.items():
    m.update(rollout_metrics(trajs, f"eval/{split}"))
    m.update({f"eval/{split}/success/{fam}": v for fam, v in family_success(trajs).items()})
  return m


def fingerprint(cfg) -> dict[str, Any]:
  return ckpt_lib.config_fingerprint(cfg, ["model.path", "env.name", "seed", "rollout.tasks_per_update",
                                           "rollout.group_size", "learner.minibatch_size", "learner.micro_batch_size"])


def summary_line(u: int, total: int, m: dict[str, Any]) -> str:
  """One log line per update: the outcome, the distillation signal and where the time went."""
  get = lambda k: m.get(k) if isinstance(m.get(k), (int, float)) else float("nan")
  times = " ".join(f"{k[5:-2]} {get(k):.0f}s" for k in ("time/rollout_s", "time/analysis_s", "time/rescore_s",
                                                          "time/update_s") if k in m)
  return (f"update {u + 1}/{total}: return {get('rollout/return'):.3f} success {get('rollout/success'):.3f} "
          f"invalid {get('rollout/invalid_action_rate'):.2f} |A| {get('advantages/abs_mean'):.3f} "
          f"skill-parse {get('analysis/parse_rate'):.2f} opd-tokens {get('update/opd_tokens'):.0f} "
          f"loss {get('update/loss'):.4f} | {times}")


def eval_key(cfg, done: int) -> jax.Array:
  """The random key of the evaluation after `done` updates (the eval stage reuses it for a checkpoint)."""
  return jax.random.fold_in(jax.random.key(cfg.seed + 1), done)


def _evaluate_record(rt: Runtime, writer: MetricsWriter, params, done: int) -> dict[str, Any]:
  """Evaluates `params` after `done` updates and writes it as its own record at step `done`."""
  t0 = time.time()
  m = evaluate(rt, params, eval_key(rt.cfg, done))
  m["eval/updates_done"] = done
  m["time/eval_s"] = time.time() - t0
  out = writer.write(done, m)
  splits = " ".join(f"{s} {out.get(f'eval/{s}/success', float('nan')):.3f}" for s in rt.eval_tasks)
  log.info("eval after %d updates: success %s | %.0fs", done, splits, m["time/eval_s"])
  return out


def train(cfg: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """The resumable RL loop; returns the last update's metrics (and the final eval's), the state, and `stopped`
  (the signal's name when SIGTERM/SIGINT ended it early, after saving the last completed update). Evaluations
  are records of their own at step = updates done (0 = the starting weights, with eval.at_start)."""
  preflight.check_workdir(workdir)
  if cfg.warmstart.before_rl:
    from seed_jax import warmstart
    if distributed.initialize(cfg.distributed) and not warmstart.is_cached(cfg):
      raise distributed.SetupError(
          f"warmstart.before_rl trains Stage 1 on one process and its cache {warmstart.cache_dir(cfg)} is empty: "
          "run this config once on one process to fill it (on a folder every host reads), or set "
          "model.path to a warm-started export and warmstart.before_rl=False")
    cfg = warmstart.with_warm_policy(cfg)
  preflight.check_disk(workdir, cfg)
  rt = build(cfg)
  is_writer = distributed.is_writer()  # [scale]
  writer = MetricsWriter(workdir, is_writer, cfg.log, run_config=cfg.to_dict())
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), cfg.train.checkpoint, fingerprint(cfg))
  total = cfg.train.num_updates
  try:
    with stop_lib.StopSignals(multi_process=jax.process_count() > 1) as stop:
      state = update_lib.init_state(jax.tree.map(jnp.copy, rt.init_params), rt.optimizer)
      if cfg.mesh.ref_params_memory == "pinned_host":  # [scale] the frozen KL reference waits in host RAM
        rt.init_params = mesh_lib.with_memory_kind(rt.init_params, "pinned_host")
      start, history, restarts_before = 0, [], 0
      if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(None, ckpt_lib.abstract_state(state))
        start, history = int(meta["next_update"]), list(meta.get("history", []))
        restarts_before = int(meta.get("env_restarts", 0))
        log.info("resumed from %s after %d updates (next: update %d/%d)", workdir, start, start + 1, total)
      if writer.rewind(start):
        log.info("metrics: dropped the records after the last checkpoint (they are redone)")
      last: dict[str, Any] = {}
      if cfg.eval.at_start and start == 0:
        _evaluate_record(rt, writer, state.params, 0)
      saved, restarts_seen, restarts = start, 0, 0  # restarts: every process's pool's, this run
      meta = lambda done: dict(next_update=done, task_position=done * cfg.rollout.tasks_per_update, history=history,
                               env_restarts=restarts_before + restarts)
      for u in range(start, total):
        t0 = time.time()
        if stop.at_sync_point(u):  # every process of a preempted pod stops before the same update
          return _stop(ckpt, state, u, saved, meta, stop.requested, last)
        try:
          state, metrics = rl_update(rt, state, u, writer, lambda: (stop.check(), ckpt.poll()))
        except stop_lib.StopRequested as e:  # state is still that of update u - 1, the last one completed
          return _stop(ckpt, state, u, saved, meta, e.signame, last)
        metrics["time/update_total_s"] = time.time() - t0
        restarts = sum(distributed.allgather_objects(rt.pool.restarts))
        metrics["env/restarts"] = restarts - restarts_seen
        metrics["env/restarts_total"] = restarts_before + restarts
        restarts_seen = restarts
        last = writer.write(u, metrics)
        log.info("%s", summary_line(u, total, last))
        if cfg.eval.every and (u + 1) % cfg.eval.every == 0 and u + 1 < total:
          _evaluate_record(rt, writer, state.params, u + 1)
        history.append({k: v for k, v in last.items() if isinstance(v, (int, float)) and "/" in k and "time" not in k})
        if ckpt.save(u + 1, state, metadata=meta(u + 1), force=u + 1 == total):
          saved = u + 1
        # The final evaluation too is left for the resumed run. Several processes agree at the next sync point.
        if stop.requested and not stop.multi_process:
          return _stop(ckpt, state, u + 1, saved, meta, stop.requested, last)
      if cfg.eval.at_end and (total > start or not writer.has_record(total, "eval/updates_done")):
        last.update(_evaluate_record(rt, writer, state.params, total))
      ckpt.wait()
      return {"metrics": last, "state": state, "stopped": None}
  finally:
    ckpt.close()
    writer.close()
    rt.close()


def _stop(ckpt, state, done: int, saved: int, meta, signame: str, last) -> dict[str, Any]:
  """Ends the loop after `done` completed updates: their checkpoint is written (if the save interval skipped
  it) and committed before returning."""
  if done > saved:
    ckpt.save(done, state, metadata=meta(done), force=True)
  ckpt.wait()
  log.info("stopped by %s after %d updates; %s", signame, done,
           f"checkpoint {done} saved" if done else "no update finished, nothing saved")
  return {"metrics": last, "state": state, "stopped": signame, "updates_done": done}
