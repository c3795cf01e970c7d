"""The eval stage: scores an HF folder or a run's Orbax checkpoint on the fixed panels and writes a per-family
table (python -m seed_jax.main --config=configs/alfworld.py:paper --config.stage=eval
--config.eval.checkpoint=runs/alf3b --config.model.path=/ckpt/Qwen2.5-3B-Instruct --workdir=runs/alf3b-eval).

The panels are played as in training's evaluations (`eval_chunks`: plain policy, no skills,
eval.temperature, eval.max_tasks; `:paper` has the paper's 0.4 and the whole panel). Every finished chunk of
episodes is appended to eval_episodes.jsonl, so a killed evaluation rerun with the same command plays only the
chunks it lacks, with the same random draws. The result is eval_results.json and eval_results.md. The stage
builds only the player (runtime.build_player): no rescorer, optimizer or update fn.
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from seed_jax import records, report, shares
from seed_jax import tasks as tasks_lib
from seed_jax import update as update_lib
from seed_jax.config import sampling
from seed_jax.envs.base import Trajectory
from seed_jax.infra import checkpoint as ckpt_lib
from seed_jax.infra import preflight
from seed_jax.infra.metrics import MetricsWriter
from seed_jax.rollout import run_episodes
from seed_jax.runtime import Player, build_player
from seed_jax.sample import SamplingParams

log = logging.getLogger(__name__)

EPISODES = "eval_episodes.jsonl"
RESULTS = "eval_results"


class EvalSourceError(ValueError):
  """The checkpoint to evaluate is missing, or the workdir holds episodes of another evaluation."""


def eval_chunks(rt: Player, params, key, skip: Callable[[str, int], bool] = lambda split, c: False):
  """Plays the fixed panels chunk by chunk (tasks.eval_chunk episodes at once) with the plain policy (ordinary
  prompts, no skills, eval temperature): yields (split, chunk index, trajectories). Chunk c of split i always
  draws from key folded with (i, c), so a resumed evaluation that `skip`s finished chunks plays the rest exactly
  as an uninterrupted one. With several processes each plays its share of a chunk; every process gets all of
  its trajectories (shares.gather_trajectories)."""
  cfg = rt.cfg
  sp = SamplingParams(*sampling(cfg, "eval"))
  for i, (split, tasks) in enumerate(rt.eval_tasks.items()):
    for c, start, mine in tasks_lib.eval_chunks(len(tasks), tasks_lib.eval_chunk(cfg)):
      if skip(split, c):
        continue
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


def evaluate(rt: Player, params, key) -> dict[str, float]:
  """eval/<split>/* rollout metrics and eval/<split>/success/<family> over every panel."""
  by_split: dict[str, list[Trajectory]] = {s: [] for s in rt.eval_tasks}
  for split, _, trajs in eval_chunks(rt, params, key):
    by_split[split] += trajs
  m: dict[str, float] = {}
  for split, trajs in by_split.items():
    m.update(report.rollout_metrics(trajs, f"eval/{split}"))
    m.update({f"eval/{split}/success/{fam}": v for fam, v in family_success(trajs).items()})
  return m


def eval_key(cfg, done: int) -> jax.Array:
  """The random key of the evaluation after `done` updates (the eval stage reuses it for a checkpoint)."""
  return jax.random.fold_in(jax.random.key(cfg.seed + 1), done)


def evaluate_record(rt: Player, writer: MetricsWriter, params, done: int) -> dict[str, Any]:
  """Evaluates `params` after `done` updates and writes it as its own record at step `done`."""
  t0 = time.time()
  m = evaluate(rt, params, eval_key(rt.cfg, done))
  m["eval/updates_done"] = done
  m["time/eval_s"] = time.time() - t0
  out = writer.write(done, m)
  splits = " ".join(f"{s} {out.get(f'eval/{s}/success', float('nan')):.3f}" for s in rt.eval_tasks)
  log.info("eval after %d updates: success %s | %.0fs", done, splits, m["time/eval_s"])
  return out


def checkpoint_dir(path: str) -> str:
  """A run's workdir (holding checkpoints/) or the checkpoints folder itself."""
  inner = os.path.join(path, "checkpoints")
  return inner if os.path.isdir(inner) else path


def source(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
  """What is evaluated and how: the workdir's episodes are valid only for the same source and settings."""
  return dict(model=cfg.model.path, checkpoint=os.path.abspath(checkpoint_dir(cfg.eval.checkpoint))
              if cfg.eval.checkpoint else "", step=cfg.eval.checkpoint_step, env=cfg.env.name,
              split=cfg.eval.split, max_tasks=cfg.eval.max_tasks, temperature=cfg.eval.temperature,
              max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed)


def load_params(rt: Player, cfg: ml_collections.ConfigDict) -> tuple[Any, int, str]:
  """(params, updates done, description): the model's own weights (0 updates), or those of an Orbax checkpoint
  of a run of this model (its step is the number of updates it holds). A checkpoint holds the whole train
  state, so its restore target is built with the run's optimizer."""
  if not cfg.eval.checkpoint:
    return rt.init_params, 0, f"weights of {cfg.model.path}"
  folder = checkpoint_dir(cfg.eval.checkpoint)
  try:
    ckpt = ckpt_lib.Checkpointer(folder, cfg.train.checkpoint, read_only=True)
  except FileNotFoundError as e:
    raise EvalSourceError(str(e)) from None
  with ckpt:
    step = None if cfg.eval.checkpoint_step < 0 else cfg.eval.checkpoint_step
    optimizer = update_lib.make_optimizer(cfg.learner)
    abstract = ckpt_lib.abstract_state(update_lib.init_state(jax.tree.map(jnp.copy, rt.init_params), optimizer))
    try:
      state, _ = ckpt.restore(step, abstract)
    except FileNotFoundError as e:
      raise EvalSourceError(str(e)) from None
    except (ValueError, TypeError) as e:  # another architecture: Orbax names the mismatching arrays
      raise EvalSourceError(f"checkpoint {folder} does not fit {cfg.model.path}: {str(e).splitlines()[0]}") from None
    done = step if step is not None else ckpt.latest_step()
  return state.params, int(done), f"checkpoint {folder} step {done}"


def _episode(t) -> dict[str, Any]:
  return dict(task_id=t.task.task_id, family=t.task.family or "all", success=bool(t.success),
              ret=float(t.episode_return), length=t.length, termination=t.termination,
              invalid=sum(not s.action_valid for s in t.steps), steps=len(t.steps))


def table(chunks: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
  """{split: {family | "overall": {episodes, success, return, invalid_action_rate, env_errors}}}; env errors
  count as episodes but not in the rates (as in training's evaluations)."""
  out: dict[str, dict[str, dict[str, float]]] = {}
  for split in dict.fromkeys(c["split"] for c in chunks):
    eps = [e for c in chunks if c["split"] == split for e in c["episodes"]]
    groups = {fam: [e for e in eps if e["family"] == fam] for fam in sorted({e["family"] for e in eps})}
    groups["overall"] = eps
    out[split] = {}
    for name, group in groups.items():
      good = [e for e in group if e["termination"] != "env_error"]
      steps = sum(e["steps"] for e in good)
      out[split][name] = dict(
          episodes=len(group), env_errors=len(group) - len(good),
          success=float(np.mean([e["success"] for e in good])) if good else 0.0,
          ret=float(np.mean([e["ret"] for e in good])) if good else 0.0,
          invalid_action_rate=sum(e["invalid"] for e in good) / steps if steps else 0.0)
  return out


def markdown(results: dict[str, Any]) -> str:
  lines = [f"Evaluation of {results['evaluated']} on {results['source']['env']} "
           f"(temperature {results['source']['temperature']}, no skills).", "",
           "| split | family | episodes | success | return | invalid actions | env errors |",
           "|---|---|---|---|---|---|---|"]
  for split, fams in results["table"].items():
    for fam, r in fams.items():
      name = f"**{fam}**" if fam == "overall" else fam
      lines.append(f"| {split} | {name} | {r['episodes']} | {r['success']:.3f} | {r['ret']:.3f} | "
                   f"{r['invalid_action_rate']:.3f} | {r['env_errors']} |")
  return "\n".join(lines) + "\n"


def run(cfg: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Evaluates, resuming from the workdir's finished chunks; returns the results written to eval_results.*."""
  preflight.check_workdir(workdir)
  episodes_path = os.path.join(workdir, EPISODES)
  meta_path = os.path.join(workdir, "eval_source.json")
  src = source(cfg)
  if os.path.exists(meta_path):
    with open(meta_path) as f:
      before = json.load(f)
    if before != src:
      diff = ", ".join(f"{k}: {before.get(k)!r} -> {v!r}" for k, v in src.items() if before.get(k) != v)
      raise EvalSourceError(f"{workdir} holds episodes of another evaluation ({diff}); use another --workdir")
  rt = build_player(cfg)
  try:
    params, updates_done, evaluated = load_params(rt, cfg)
    with open(meta_path, "w") as f:
      json.dump(src, f, indent=1)
    chunks = records.read_records(episodes_path, repair=True)  # a chunk cut off by a kill is played again
    done = {(c["split"], c["chunk"]) for c in chunks}
    if done:
      log.info("eval: %d chunks already played in %s", len(done), episodes_path)
    key = eval_key(cfg, updates_done)  # the draws of the run's own evaluation of these weights
    for split, c, trajs in eval_chunks(rt, params, key, skip=lambda s, c: (s, c) in done):
      chunks.append(dict(split=split, chunk=c, episodes=[_episode(t) for t in trajs]))
      records.append_records(episodes_path, chunks[-1:])
      log.info("eval: %s chunk %d: success %.3f over %d episodes", split, c,
               np.mean([e["success"] for e in chunks[-1]["episodes"]]), len(trajs))
  finally:
    rt.close()
  order = {s: i for i, s in enumerate(rt.eval_tasks)}
  chunks.sort(key=lambda c: (order[c["split"]], c["chunk"]))
  results = dict(evaluated=evaluated, source=src, table=table(chunks))
  with open(os.path.join(workdir, RESULTS + ".json"), "w") as f:
    json.dump(results, f, indent=1)
  with open(os.path.join(workdir, RESULTS + ".md"), "w") as f:
    f.write(markdown(results))
  return results
