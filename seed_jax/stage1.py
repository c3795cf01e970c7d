"""Stage 1 data (docs/algorithm.md §2): collect base-policy trajectories, then annotate each with a
hindsight skill, giving the SFT records (analysis prompt -> `{"episode_summary", "episode_skill"}`).

Both stages are resumable. Collection appends each finished task group as one JSONL line (one write, then
fsync); annotation appends each finished chunk of analyses to its log. On start a file is read back, a torn
last line (a write cut short by a crash) is cut off, and the task groups / trajectories already there are
skipped, so a restart neither repeats nor loses records.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Callable

import jax
import ml_collections
import numpy as np

from seed_jax import analyzers, sft_oracle, shares, skills, slots
from seed_jax.config import sampling
from seed_jax.envs import get_family
from seed_jax.envs.base import Step, Task, Trajectory
from seed_jax.envs.pool import EnvPool
from seed_jax.infra import distributed
from seed_jax.infra.mesh import mesh_from_config
from seed_jax.models import load
from seed_jax.records import append_records, read_records, unique, write_records
from seed_jax.rollout import run_episodes
from seed_jax.sample import Sampler, SamplerConfig, SamplingParams
from seed_jax.tasks import tasks_for_update

log = logging.getLogger(__name__)

TRAJECTORIES_FILE = "trajectories.jsonl"  # collect -> annotate
ANNOTATIONS_FILE = "annotations.jsonl"  # every analysed trajectory: reply, parse result (annotate's resume log)
RECORDS_FILE = "sft_records.jsonl"  # the kept records: annotate -> sft
ANALYZERS = ("oracle", "local", "external")


# ----------------------------------------------------------------------------------------------------------
# Trajectories as JSON (no token ids: annotation and SFT work on text)

_STEP_FIELDS = ("observation", "response_text", "action", "action_valid", "reward", "done", "info")


def traj_to_json(t: Trajectory) -> dict:
  return dict(task=t.task.to_json(), group_id=t.group_id, traj_id=t.traj_id, episode_return=t.episode_return,
              success=t.success, score=t.score, termination=t.termination, truncated_prompts=t.truncated_prompts,
              task_description=t.task_description, info=t.info,
              steps=[{f: getattr(s, f) for f in _STEP_FIELDS} for s in t.steps])


def traj_from_json(d: dict) -> Trajectory:
  steps = [Step(prompt_text="", prompt_tokens=[], response_tokens=[], logps=[], **{f: s[f] for f in _STEP_FIELDS})
           for s in d["steps"]]
  return Trajectory(task=Task.from_json(d["task"]), group_id=d["group_id"], traj_id=d["traj_id"], steps=steps,
                    episode_return=d["episode_return"], success=d["success"], score=d["score"],
                    termination=d["termination"], truncated_prompts=d["truncated_prompts"],
                    task_description=d["task_description"], info=d["info"])


def load_trajectories(path: str) -> list[tuple[int, Trajectory]]:
  """(task index, trajectory) of every collected group, in task order."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"no trajectory file {path!r}: run the collect stage first (or set annotate.input)")
  groups = unique(read_records(path), lambda r: r["task_index"])
  return [(i, traj_from_json(t)) for i in sorted(groups) for t in groups[i]["trajectories"]]


# ----------------------------------------------------------------------------------------------------------
# Collection


def collection_tasks(cfg: ml_collections.ConfigDict) -> list[Task]:
  """The first collect.num_tasks tasks of the RL task stream (a seeded permutation of the train panel)."""
  panel = get_family(cfg.env.name).tasks(cfg.env, cfg.env.train_split)
  return tasks_for_update(panel, 0, cfg.collect.num_tasks, cfg.seed)


def stage_mesh(cfg: ml_collections.ConfigDict, mesh=None):
  """`mesh`, or config.mesh over every device of every process; with several processes each must own a block
  of the rows (its own episodes' or records')."""
  mesh = mesh if mesh is not None else mesh_from_config(cfg.mesh)
  if jax.process_count() > 1:
    distributed.check_row_split(mesh)
  return mesh


def collect(cfg: ml_collections.ConfigDict, workdir: str, mesh=None) -> dict[str, float]:
  """Rolls out the base policy on N tasks x K rollouts; appends one line per finished task group. `mesh`
  defaults to config.mesh.shape over all devices. With several processes each plays its share of every batch's
  task groups (shares.my_tasks) and process 0 appends all of them: the file one process writes."""
  cc = cfg.collect
  path = cc.output or os.path.join(workdir, TRAJECTORIES_FILE)
  tasks = collection_tasks(cfg)
  done = set(shares.from_writer(lambda: sorted(unique(read_records(path, repair=True), lambda r: r["task_index"]))))
  pending = [i for i in range(len(tasks)) if i not in done]
  log.info("collect: %d of %d task groups already in %s; %d to go", len(done), len(tasks), path, len(pending))
  stats = {"collect/groups_done_before": float(len(done)), "collect/groups_written": 0.0}
  if not pending:
    return stats
  mesh = stage_mesh(cfg, mesh)
  spec, params = load.load_model(cfg.model.path, mesh)
  spec = spec.with_attention(cfg.model)
  tok = load.load_tokenizer(cfg.model.tokenizer or cfg.model.path)
  family = get_family(cfg.env.name)
  sampler = Sampler(spec, tok.eos_ids, SamplerConfig(max_prompt_len=cfg.model.max_prompt_tokens,
                                                     max_batch=cfg.sampler.max_batch, dtype=cfg.sampler.dtype,
                                                     refill=cfg.sampler.refill,
                                                     prefix_reuse_mb=cfg.sampler.prefix_reuse_mb), mesh)
  sp = SamplingParams(*sampling(cfg, "collect"))
  stops = [tok.encode(s) for s in cfg.rollout.stop_strings]
  generate, serve = sampler.rollout_fn(params, sp, stops), slots.server(sampler, params, sp, stops)
  K, per = cc.rollouts, min(cc.tasks_per_batch, len(pending))
  n_traj = n_ok = n_steps = 0
  t0 = time.perf_counter()
  with EnvPool(family, cfg.env, -(-per // jax.process_count()) * K) as pool:
    for start in range(0, len(pending), per):
      idx = pending[start:start + per]
      mine = [(j, k) for j in shares.my_tasks(len(idx)) for k in range(K)]  # episode j * K + k of the batch
      trajs = run_episodes(pool, family, cfg.env, [tasks[idx[j]] for j, _ in mine], [idx[j] for j, _ in mine],
                           [k for _, k in mine], generate, tok, jax.random.fold_in(jax.random.key(cfg.seed), idx[0]),
                           max_prompt_tokens=cfg.model.max_prompt_tokens, episode_ids=[j * K + k for j, k in mine],
                           serve=serve)
      trajs = shares.gather_trajectories(trajs)  # every group's, in (task, rollout) order
      if distributed.is_writer():
        append_records(path, [dict(task_index=i, task=tasks[i].to_json(),
                                   trajectories=[traj_to_json(t) for t in trajs[j * K:(j + 1) * K]])
                              for j, i in enumerate(idx)])
      n_traj += len(trajs)
      n_ok += sum(t.success for t in trajs)
      n_steps += sum(t.length for t in trajs)
      minutes = (time.perf_counter() - t0) / 60
      log.info("collect: %d/%d groups, %.1f trajectories/min, success %.3f", len(done) + start + len(idx),
               len(tasks), n_traj / minutes, n_ok / n_traj)
  minutes = (time.perf_counter() - t0) / 60
  stats.update({"collect/groups_written": float(len(pending)), "collect/trajectories": float(n_traj),
                "collect/trajectories_per_min": n_traj / minutes, "collect/success": n_ok / max(n_traj, 1),
                "collect/steps_per_trajectory": n_steps / max(n_traj, 1), "collect/minutes": minutes})
  return shares.from_writer(lambda: stats)  # once process 0 has appended the last groups


# ----------------------------------------------------------------------------------------------------------
# Annotation


@dataclasses.dataclass
class _Backend:
  """Replies for a chunk: `reply(items, prompts)` with items = [(task index, trajectory)]; `stats()` counts over
  every process."""
  reply: Callable[[list[tuple[int, Trajectory]], list[str]], list[str]]
  count_tokens: Callable[[str], int]
  stats: Callable[[], dict[str, int]]


def _backend(cfg: ml_collections.ConfigDict, items: list[tuple[int, Trajectory]], mesh) -> _Backend:
  ac = cfg.annotate
  tok = load.load_tokenizer(cfg.model.tokenizer or cfg.model.path)  # the policy's, which SFT trains
  count = lambda s: len(tok.encode_chat(s))
  if ac.analyzer == "oracle":  # each process searches its share of the tasks; every process gets every path
    by_task = {i: t.task for i, t in items}
    ids = shares.my_share(sorted(by_task))
    found = sft_oracle.fetch_gold_paths(get_family(cfg.env.name), cfg.env, [by_task[i] for i in ids], ac.gold_envs)
    gold = {i: g for part in distributed.allgather_objects(dict(zip(ids, found))) for i, g in part.items()}
    thr = cfg.analyzer.success_threshold
    log.info("annotate: gold paths for %d of %d tasks", sum(g is not None for g in gold.values()), len(gold))
    return _Backend(lambda chunk, _: [sft_oracle.oracle_reply(t, gold[i], thr) for i, t in chunk], count,
                    lambda: {"tasks_without_gold": sum(g is None for g in gold.values())})
  summed = lambda stats: lambda: {k: sum(part[k] for part in distributed.allgather_objects(stats.as_dict()))
                                  for k in stats.as_dict()}  # every process's requests
  if ac.analyzer == "external":
    analyzer = analyzers.ExternalAnalyzer(cfg.analyzer.external)
    return _Backend(lambda _, prompts: analyzer.analyze(prompts), count, summed(analyzer.stats))
  if ac.analyzer == "local":
    mesh = stage_mesh(cfg, mesh)
    spec, params = load.load_model(ac.local_model_path, mesh)
    spec = spec.with_attention(cfg.model)
    ltok = load.load_tokenizer(ac.local_model_path)
    sampler = Sampler(spec, ltok.eos_ids, SamplerConfig(max_prompt_len=ac.max_prompt_tokens,
                                                        max_batch=ac.local_max_batch, dtype=ac.local_dtype,
                                                        prefix_reuse_mb=cfg.sampler.prefix_reuse_mb), mesh)
    sp = SamplingParams(*sampling(cfg, "annotate"))
    analyzer = analyzers.PolicyAnalyzer(
        lambda texts: sampler.generate_text(params, texts, jax.random.key(cfg.seed), sp, ltok))
    # Prompts must fit both the SFT'd policy and the annotating model.
    return _Backend(lambda _, prompts: analyzer.analyze(prompts),
                    lambda s: max(count(s), len(ltok.encode_chat(s))), summed(analyzer.stats))
  raise ValueError(f"annotate.analyzer={ac.analyzer!r}; allowed: {ANALYZERS}")


def annotate(cfg: ml_collections.ConfigDict, workdir: str, mesh=None) -> dict[str, float]:
  """Analyses every collected trajectory (env errors and empty episodes excluded) with the chosen analyzer,
  logs each reply, and writes the records whose reply parses with a non-empty skill. `mesh` (the "local"
  analyzer's) defaults to config.mesh.shape over all devices."""
  ac = cfg.annotate  # its values are config.validate's
  in_path = ac.input or os.path.join(workdir, TRAJECTORIES_FILE)
  log_path = ac.log or os.path.join(workdir, ANNOTATIONS_FILE)
  out_path = ac.output or os.path.join(workdir, RECORDS_FILE)
  collected = load_trajectories(in_path)
  usable = [(i, t) for i, t in collected if t.steps and t.termination != "env_error"]
  done = set(shares.from_writer(lambda: sorted(unique(read_records(log_path, repair=True),
                                                lambda r: (r["task_index"], r["traj_id"])))))
  pending = [(i, t) for i, t in usable if (i, t.traj_id) not in done]
  log.info("annotate (%s): %d trajectories, %d usable, %d already analysed", ac.analyzer, len(collected),
           len(usable), len(usable) - len(pending))
  backend_stats: dict[str, int] = {}
  if pending:  # with several processes each analyses its share of every chunk; process 0 logs the whole chunk
    chunks = [pending[start:start + ac.chunk] for start in range(0, len(pending), ac.chunk)]
    backend = _backend(cfg, pending, mesh)
    thr = cfg.analyzer.success_threshold
    for n, chunk in enumerate(chunks):
      mine = shares.my_share(chunk)
      prompts = [skills.analysis_prompt_fitted(t, backend.count_tokens, ac.max_prompt_tokens, thr) for _, t in mine]
      replies = backend.reply(mine, prompts)  # collective for the "local" analyzer
      if len(replies) != len(mine):
        raise ValueError(f"analyzer returned {len(replies)} replies for {len(mine)} prompts")
      lines = []
      for (i, t), prompt, reply in zip(mine, prompts, replies):
        p = skills.parse_skill(reply)
        lines.append(dict(task_index=i, traj_id=t.traj_id, task_id=t.task.task_id,
                          success=skills.is_success(t, thr), analyzer=ac.analyzer, ok=p.ok, error=p.error,
                          prompt=prompt, reply=reply,
                          response=skills.format_skill_json(p.summary or "", p.skill) if p.ok else None))
      lines = shares.gather_shares(lines)
      if distributed.is_writer():
        append_records(log_path, lines)
      log.info("annotate: %d/%d analysed", len(usable) - len(pending) + n * ac.chunk + len(chunk), len(usable))
    backend_stats = backend.stats()  # over every process (collective)
  return shares.from_writer(lambda: _write_records(read_records(log_path), usable, out_path, backend_stats))


def _write_records(log_lines: list[dict], usable: list[tuple[int, Trajectory]], out_path: str,
                   backend_stats: dict[str, int]) -> dict[str, float]:
  """Writes the kept records (in trajectory order) to `out_path` at once (temporary file + rename); process 0
  only."""
  by_key = unique(log_lines, lambda r: (r["task_index"], r["traj_id"]))
  rows = [by_key[(i, t.traj_id)] for i, t in usable if (i, t.traj_id) in by_key]
  kept = [r for r in rows if r["ok"]]
  write_records(out_path, [{k: r[k] for k in ("prompt", "response", "task_index", "traj_id", "task_id", "success",
                                               "analyzer")} for r in kept])
  rate = lambda rs: sum(r["ok"] for r in rs) / len(rs) if rs else 0.0
  stats = {"annotate/analysed": float(len(rows)), "annotate/kept": float(len(kept)), "annotate/keep_rate": rate(rows),
           "annotate/success_share": float(np.mean([r["success"] for r in rows])) if rows else 0.0}
  for kind, success in (("success", True), ("failure", False)):
    some = [r for r in rows if r["success"] == success]
    if some:  # absent, not 0, when there is no trajectory of that kind
      stats[f"annotate/keep_rate_{kind}"] = rate(some)
  stats.update({f"annotate/analyzer_{k}": float(v) for k, v in backend_stats.items()})
  log.info("annotate: kept %d of %d (keep rate %.3f) -> %s", len(kept), len(rows), stats["annotate/keep_rate"],
           out_path)
  return stats
