"""One SEED update as the method's steps: rollout -> self-analysis -> collect -> dual-context re-score ->
advantages -> PPO epochs -> report. The loop around it is loop.py; what it runs on is runtime.Runtime."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from seed_jax import batch as batch_lib
from seed_jax import advantages, analyzers, losses, report, shares, skills, slots, teacher_quality
from seed_jax import tasks as tasks_lib
from seed_jax import update as update_lib
from seed_jax.buckets import TokenCount
from seed_jax.config import sampling
from seed_jax.envs.base import Trajectory
from seed_jax.infra import distributed
from seed_jax.infra import mesh as mesh_lib
from seed_jax.infra.metrics import MetricsWriter
from seed_jax.rollout import run_episodes
from seed_jax.runtime import Runtime
from seed_jax.sample import Sampler, SamplingParams

log = logging.getLogger(__name__)


def analysis_active(cfg, u: int) -> bool:
  a = cfg.analyzer
  return bool(a.enabled) and u >= a.start_update and (a.stop_update < 0 or u < a.stop_update)


@dataclasses.dataclass
class Played:
  """One update's rollout, what every arm of a paired comparison (seed_jax.paired) shares."""
  u: int
  key: Any
  good: list[Trajectory]  # this process's episodes without env errors: the ones that enter the update
  everyone: list[Trajectory]  # [scale] every process's, for metrics and dumps
  metrics: dict[str, Any]
  tokens: dict[str, TokenCount]

  @property
  def usable(self) -> bool:
    return any(t.steps for t in self.everyone if t.termination != "env_error")


def rl_update(rt: Runtime, state: update_lib.TrainState, u: int, writer: MetricsWriter,
              check: Callable[[], None] = lambda: None, nan_advantages: bool = False) -> tuple[Any, dict]:
  """One SEED update: rollout -> analyze -> collect -> re-score -> advantages -> PPO -> report. `check` runs
  before each phase up to the PPO step and may raise to end the update there (the state is then unchanged):
  a requested stop, a failed checkpoint write. `nan_advantages`: a fault drill (seed_jax.infra.faults)."""
  timer = writer.phase_timer()
  played = play(rt, state.params, u, timer, check)
  if not played.usable:
    log.warning("update %d: no usable step-samples (all episodes failed to start); skipping", u)
    return state, played.metrics
  analysis, metrics = None, dict(played.metrics)
  if analysis_active(rt.cfg, u):
    analysis, am = self_analysis(rt, state.params, played, timer, writer, check)
    metrics.update(am)
  return learn(rt, state, played, analysis, metrics, timer, writer, check, nan_advantages)


def play(rt: Runtime, params, u: int, timer, check: Callable[[], None] = lambda: None) -> Played:
  """Update u's rollout with the current weights, its metrics and the rollout's fingerprint."""
  key = jax.random.fold_in(jax.random.key(rt.cfg.seed), u)
  before, clock = rt.sampler.tokens.copy(), {}
  check()
  with timer.phase("rollout"), sampler_times(rt.sampler, clock):
    trajs = _rollout(rt, params, u, jax.random.fold_in(key, 0), clock)
  tokens = {"rollout": rt.sampler.tokens - before}  # per phase; rollout and analysis share the sampler's counter
  good = [t for t in trajs if t.termination != "env_error"]  # this process's
  everyone = shares.gather_trajectories(trajs)  # [scale] metrics and dumps are over every process's episodes
  metrics = report.rollout_metrics(everyone, "rollout")
  metrics["rollout/fingerprint"] = report.fingerprint(everyone)
  metrics.update({f"time/rollout_{k}": v for k, v in clock.items()})
  return Played(u, key, good, everyone, metrics, tokens)


def self_analysis(rt: Runtime, params, played: Played, timer, writer: MetricsWriter | None,
                  check: Callable[[], None] = lambda: None) -> tuple[skills.Analysis, dict[str, Any]]:
  """A hindsight skill per trajectory from config.analyzer's backend (and control); adds the analysis tokens to
  `played.tokens`."""
  before, clock = rt.sampler.tokens.copy(), {}
  check()
  with timer.phase("analysis"), sampler_times(rt.sampler, clock):
    analysis = _analyze(rt, params, played.good, jax.random.fold_in(played.key, 1))
  played.tokens["analysis"] = rt.sampler.tokens - before
  metrics = {f"time/analysis_{k}": v for k, v in clock.items()}
  records = shares.gather_records(_skill_records(played.good, analysis))
  metrics["analysis/parse_rate"] = float(np.mean([r["ok"] for r in records])) if records else 0.0
  metrics["analysis/salvaged_rate"] = float(np.mean([r["salvaged"] for r in records])) if records else 0.0
  if writer is not None:
    writer.dump_jsonl("skills", played.u, records)
  return analysis, metrics


def learn(rt: Runtime, state: update_lib.TrainState, played: Played, analysis: skills.Analysis | None,
          metrics: dict[str, Any], timer, writer: MetricsWriter | None,
          check: Callable[[], None] = lambda: None, nan_advantages: bool = False) -> tuple[Any, dict]:
  """collect -> re-score -> advantages -> PPO epochs -> report, from `state` on the played batch with these
  skills (None: no analysis this update). Leaves `played` unchanged, so several arms can learn from it."""
  cfg, good, u, key = rt.cfg, played.good, played.u, played.key
  metrics, tokens = dict(metrics), dict(played.tokens)
  samples = batch_lib.collect_samples(good, None if analysis is None else analysis.skills, rt.tokenizer,
                                      cfg.model.max_prompt_tokens)
  draw = shares.MinibatchDraw(shares.step_keys(good))  # [scale] collective: every process's step-samples
  teacher_metrics = analysis is not None and cfg.analyzer.teacher_metrics and rt.family.has_gold_paths
  source = old_logps_source(cfg, draw.total)
  before = rt.rescorer.tokens.copy()
  check()
  with timer.phase("rescore"):  # the teacher metrics read π_old before the update, on the rows with a skill only
    old_logp, skill_logp, ref_logp = rescore_samples(rt, state.params, samples, with_skills=analysis is not None,
                                                     old_source=source, old_on_skill_rows=teacher_metrics)
  tokens["rescore"] = rt.rescorer.tokens - before
  if teacher_metrics:
    with timer.phase("teacher"):  # [scale] collective: the condition is the same on every process
      rows = teacher_quality.sample_rows(rt, state.params, good, samples, old_logp,
                                         skill_logp if rt.teacher.rescore_skill_prompts else None)
    rows = shares.gather_records(rows)
    metrics.update(teacher_quality.metrics(rows))
    if writer is not None:
      writer.dump_jsonl("teacher", u, rows)
  adv_N = advantages.compute_advantages(advantages.StepSamples.from_trajectories(good), cfg.objectives)
  if nan_advantages:  # the fault drill's NaN loss and gradient
    adv_N = np.full_like(adv_N, np.nan)
  metrics.update(advantage_metrics(shares.gather_concat(adv_N)))  # groups are host-local: no gather needed above
  metrics["rescore/old_logps_from_sampler"] = float(source == "sampler")
  metrics["rescore/old_logps_from_update"] = float(source == "update")
  # Without skills this update (analysis off or outside its window) the OPD mask is all False: its term is 0
  # and the same compiled update serves.
  check()
  with timer.phase("update"):
    if cfg.learner.schedule == "warmup_constant":
      lr = update_lib.update_lr(cfg.learner, u, cfg.train.num_updates)
      state, metrics["update/lr"] = update_lib.with_update_lr(state, lr), lr
    state, upd, tokens["update"] = _ppo_epochs(rt, state, samples, draw, adv_N,
                                               None if source == "update" else old_logp, ref_logp, skill_logp, key)
  metrics.update(upd)
  metrics.update(report.update_report(rt, played.everyone, samples, timer.pop(), shares.gather_tokens(tokens)))
  if writer is not None:
    writer.dump_jsonl("trajectories", u, [report.traj_record(t) for t in played.everyone[:cfg.train.dump_trajectories]])
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
  tasks = tasks_lib.tasks_for_update(rt.train_tasks, u, cfg.rollout.tasks_per_update, cfg.seed)
  mine = tasks_lib.my_update_episodes(len(tasks), G)
  sp = SamplingParams(*sampling(cfg, "rollout"))
  return run_episodes(rt.pool, rt.family, cfg.env, [tasks[b] for b, _ in mine], [u * len(tasks) + b for b, _ in mine],
                      [g for _, g in mine], rt.sampler.rollout_fn(params, sp, rt.stop_sequences),
                      rt.tokenizer, key, max_prompt_tokens=cfg.model.max_prompt_tokens, clock=clock,
                      episode_ids=[b * G + g for b, g in mine],
                      serve=slots.server(rt.sampler, params, sp, rt.stop_sequences))


def _analyze(rt: Runtime, params, trajs: Sequence[Trajectory], key) -> skills.Analysis:
  """A hindsight skill per trajectory; the policy backend decodes greedily with the current weights, the oracle
  reads the tasks' gold paths. analyzer.control="shuffled" then gives each trajectory another task's skill."""
  ac = rt.cfg.analyzer
  sp = SamplingParams(*sampling(rt.cfg, "analysis"))
  analyzer = analyzers.make_analyzer(
      ac, lambda texts: rt.sampler.generate_text(params, texts, key, sp, rt.tokenizer),
      lambda: analyzers.OracleAnalyzer(trajs, rt.gold_paths([t.task for t in trajs]), ac.success_threshold))
  analysis = skills.analyze_trajectories(analyzer, trajs, ac, count_tokens=lambda s: len(rt.tokenizer.encode_chat(s)))
  if ac.control == "shuffled":
    seed = int(np.asarray(jax.random.key_data(key)).ravel()[-1])
    analysis = analyzers.shuffled_skills(analysis, [t.task.task_id for t in trajs], seed)
  return analysis


def old_logps_source(cfg: ml_collections.ConfigDict, total_samples: int) -> str:
  """Where the update's π_old log-probs come from (rescore.old_logps): "sampler" (with fp32 sampling and fp32
  scoring at a non-zero temperature they are the numbers a re-score would compute; tests hold them equal within
  1e-5), "update" (the update's own forward, stop-gradient: exact when the update is a single optimizer step of
  the policy that sampled, as TRL's GRPO does with one iteration) or "rescore" (a forward of the ordinary context
  in the re-score)."""
  mode = cfg.rescore.old_logps
  if (mode == "auto" and cfg.sampler.dtype == "float32" and cfg.rescore.dtype == "float32"
      and cfg.rollout.temperature > 0):
    return "sampler"
  one_step = cfg.learner.ppo_epochs == 1 and total_samples <= cfg.learner.minibatch_size
  return "update" if mode in ("auto", "update") and one_step else "rescore"


def rescore_samples(rt: Runtime, params, samples: batch_lib.Samples, with_skills: bool, old_source: str = "rescore",
                    old_on_skill_rows: bool = False):
  """(π_old, skill-context, reference) log-probs per sample. π_old's come from `old_source`
  (old_logps_source): the sampler's, None ("update": the update takes its own; with `old_on_skill_rows`, for
  what reads them before it, re-scored on the rows with a skill and None elsewhere), or re-scored here. The skill
  context is re-scored only when the teacher is π_old and this update has skills; otherwise the π_old log-probs
  stand in (the OPD mask is all False, or the update scores H(h, s) with π_θ itself). The reference is None
  without a KL term."""
  cfg = rt.cfg
  # No row with a skill (every analysis failed): H(h, s) is the ordinary prompt and the OPD mask is all False.
  with_skills = with_skills and distributed.any_process(samples.opd_mask_N.any())  # [scale] the same passes everywhere
  # Only the rows with a skill are scored under it: elsewhere the OPD mask is False and nothing reads the value.
  skill_rows = lambda prompts: [p if m else None for p, m in zip(prompts, samples.opd_mask_N)]  # None: left out
  skill_ctx = [skill_rows(samples.skill_prompts)] if with_skills and rt.teacher.rescore_skill_prompts else []
  partial_old = old_source == "update" and old_on_skill_rows and with_skills
  old_ctx = [samples.prompts] if old_source == "rescore" else [skill_rows(samples.prompts)] if partial_old else []
  contexts = old_ctx + skill_ctx
  lp = rt.rescorer.score(params, contexts, samples.responses, cfg.rollout.temperature,
                         images=samples.images)[0] if contexts else []
  if old_ctx:
    old = lp[0]
  elif old_source == "sampler":
    old = [np.asarray(x, np.float32) for x in samples.sampled_logps]
  else:  # "update": the update's own forward, under stop-gradient
    old = None
  if skill_ctx:  # rows without a skill: their ordinary-context log-probs where known (masked out either way)
    lp[-1] = [x if x is not None else old[i] if old is not None and old[i] is not None else
              np.zeros(len(r), np.float32) for i, (x, r) in enumerate(zip(lp[-1], samples.responses))]
  ref = None
  if rt.loss_cfg.kl_coef:
    ref_params = mesh_lib.with_memory_kind(rt.init_params, "device")  # [scale] no-op unless kept in host RAM
    ref = rt.rescorer.score(ref_params, [samples.prompts], samples.responses, cfg.rollout.temperature,
                            images=samples.images)[0][0]
  return old, lp[-1] if skill_ctx else None if partial_old else old, ref


def advantage_metrics(adv_N: np.ndarray) -> dict[str, float]:
  """How much learning signal the update carries: all zeros means every step-sample scored the same."""
  a = np.abs(np.asarray(adv_N, np.float64))
  return {"advantages/abs_mean": float(a.mean()) if a.size else 0.0,
          "advantages/nonzero_frac": float((a > 1e-8).mean()) if a.size else 0.0}


def _skill_records(trajs: Sequence[Trajectory], analysis: skills.Analysis) -> list[dict]:
  return [dict(task=t.task.task_id, group=t.group_id, traj=t.traj_id, success=t.success, ok=p.ok, skill=p.skill,
               summary=p.summary, error=p.error, reply=r, salvaged=p.salvaged)
          for t, p, r in zip(trajs, analysis.parses, analysis.replies)]


def _ppo_epochs(rt: Runtime, state, samples, draw: shares.MinibatchDraw, adv_N, old_logp, ref_logp, skill_logp,
                key):
  """ppo_epochs passes over shuffled mini-batches (batch.minibatches lays them out); update/* metrics are means
  over the optimizer steps. Also returns the token positions the steps computed against the real rows' prompt
  and response lengths. `draw` places this process's samples in the canonical order the mini-batches are drawn
  over. `old_logp` None: each step's own log-probs are π_old's (old_logps_source "update")."""
  cfg = rt.cfg
  per = min(cfg.learner.minibatch_size, draw.total)
  rng = np.random.default_rng(np.asarray(jax.random.key_data(jax.random.fold_in(key, 2))).ravel().tolist())
  ready = batch_lib.minibatches(
      samples, draw.minibatches(rng, per, cfg.learner.ppo_epochs), per, mesh=rt.mesh,
      micro_batch_size=cfg.learner.micro_batch_size, pack_length=rt.teacher.update_pack_length,
      max_response_len=cfg.rollout.max_new_tokens, with_skill_prompts=rt.teacher.update_reads_skill_prompts,
      share_prefix=cfg.learner.share_prefix,
      pad_id=rt.tokenizer.pad_id, adv_N=adv_N, old_logp=old_logp, ref_logp=ref_logp, skill_logp=skill_logp,
      vs=rt.spec.vision)
  sums_all: dict[str, float] = {}
  n_steps = 0
  tokens = TokenCount()
  for shape, batch, t in ready:
    tokens.add(t)
    if rt.update_compiles.see(shape + (old_logp is None, ref_logp is None, skill_logp is None)):
      log.info("compiling update: %s", " x ".join(map(str, shape)))
    with jax.set_mesh(rt.mesh):
      state, sums = rt.update_fn(state, batch, jnp.float32(cfg.rollout.temperature))
    for k, v in losses.finalize_metrics(jax.device_get(sums)).items():
      sums_all[k] = sums_all.get(k, 0.0) + float(v)
    n_steps += 1
  out = {f"update/{k}": v / max(n_steps, 1) for k, v in sums_all.items()}
  out["update/optimizer_steps"] = n_steps
  out["update/skipped_total"] = int(state.skipped)
  return state, out, tokens
