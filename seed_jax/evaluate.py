"""The eval stage: scores an HF folder or a run's Orbax checkpoint on the fixed panels and writes a per-family
table (python -m seed_jax.main --config=configs/alfworld.py:paper --config.stage=eval
--config.eval.checkpoint=runs/alf3b --config.model.path=/ckpt/Qwen2.5-3B-Instruct --workdir=runs/alf3b-eval).

The panels are played as in training's evaluations (`eval_chunks`: plain policy, no skills, eval.temperature
or each of eval.temperatures, eval.max_tasks; `:paper` has the paper's 0.4 and the whole panel). Every finished
chunk of episodes is appended to eval_episodes.jsonl, so a killed evaluation rerun with the same command plays only
the chunks it lacks, with the same random draws. The result is eval_results.json and eval_results.md. The stage
builds only the player (runtime.build_player): no rescorer, optimizer or update fn.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from seed_jax import records, report, shares, slots
from seed_jax import tasks as tasks_lib
from seed_jax import update as update_lib
from seed_jax.config import sampling
from seed_jax.envs.base import Trajectory
from seed_jax.infra import checkpoint as ckpt_lib
from seed_jax.infra import distributed
from seed_jax.infra import preflight
from seed_jax.infra.metrics import MetricsWriter
from seed_jax.rollout import run_episodes
from seed_jax.runtime import Player, build_player
from seed_jax.sample import SamplingParams

log = logging.getLogger(__name__)

EPISODES = "eval_episodes.jsonl"
RESULTS = "eval_results"
EPISODE_DUMP = "eval_episodes"  # training's evaluations: <workdir>/dumps/eval_episodes_step<updates done>.jsonl


class EvalSourceError(ValueError):
  """The checkpoint to evaluate is missing, or the workdir holds episodes of another evaluation."""


class Panel(NamedTuple):
  """One split played at one temperature; its metrics are eval/<name>/*."""
  name: str
  split: str
  index: int  # the split's position among the panels' splits: its chunks' keys
  temperature: float


def temperatures(cfg: ml_collections.ConfigDict) -> tuple[float, ...]:
  """The evaluation temperatures: eval.temperatures, or eval.temperature alone when that is empty. The first
  keeps the untagged eval/<split>/* keys, so eval.temperature (the 'eval' sampling row) must be it."""
  temps = tuple(float(t) for t in cfg.eval.get("temperatures", ()))
  if not temps:
    return (float(cfg.eval.temperature),)
  if temps[0] != cfg.eval.temperature or len(set(temps)) < len(temps):
    raise ValueError(f"config.eval.temperatures={temps} must hold distinct temperatures, the first "
                     f"config.eval.temperature={cfg.eval.temperature}")
  return temps


def panels(cfg: ml_collections.ConfigDict, splits: Sequence[str]) -> list[Panel]:
  """Every split at every evaluation temperature, the first temperature's first; the others' names are tagged
  <split>_t<T> (a split's own name keeps meaning the first temperature, as without eval.temperatures)."""
  temps = temperatures(cfg)
  return [Panel(s if t == temps[0] else f"{s}_t{t:g}", s, i, t) for t in temps for i, s in enumerate(splits)]


def eval_chunks(rt: Player, params, key, skip: Callable[[str, int], bool] = lambda panel, c: False):
  """Plays the fixed panels chunk by chunk (tasks.eval_chunk episodes at once) with the plain policy (ordinary
  prompts, no skills, each eval temperature): yields (Panel, chunk index, trajectories). Chunk c of split i
  always draws from key folded with (i, c), at every temperature, so a resumed evaluation that `skip`s finished
  chunks (by panel name) plays the rest exactly as an uninterrupted one, and the temperatures are compared on the
  same draws. With several processes each plays its share of a chunk; every process gets all of its
  trajectories (shares.gather_trajectories)."""
  cfg = rt.cfg
  base = SamplingParams(*sampling(cfg, "eval"))
  for panel in panels(cfg, list(rt.eval_tasks)):
    sp = dataclasses.replace(base, temperature=panel.temperature)
    tasks = rt.eval_tasks[panel.split]
    for c, start, mine in tasks_lib.eval_chunks(len(tasks), tasks_lib.eval_chunk(cfg)):
      if skip(panel.name, c):
        continue
      trajs = run_episodes(rt.pool, rt.family, cfg.env, [tasks[k] for k in mine], mine, [0] * len(mine),
                           rt.sampler.rollout_fn(params, sp, rt.stop_sequences), rt.tokenizer,
                           jax.random.fold_in(jax.random.fold_in(key, panel.index), c),
                           max_prompt_tokens=cfg.model.max_prompt_tokens, episode_ids=[k - start for k in mine],
                           serve=slots.server(rt.sampler, params, sp, rt.stop_sequences))
      yield panel, c, shares.gather_trajectories(trajs)


def family_success(trajs: Sequence[Trajectory]) -> dict[str, float]:
  """Success rate per task family ("all" when the benchmark has none); env errors are left out."""
  out = {}
  for fam in sorted({t.task.family for t in trajs}):
    ok = [t.success for t in trajs if t.task.family == fam and t.termination != "env_error"]
    out[fam or "all"] = float(np.mean(ok)) if ok else 0.0
  return out


def evaluate(rt: Player, params, key) -> tuple[dict[str, float], list[dict[str, Any]]]:
  """eval/<panel>/* rollout metrics and eval/<panel>/success/<family> over every panel, and one row per episode
  (panel, split, temperature, chunk, panel index, task and outcome: what paired tests between runs need)."""
  by_panel: dict[str, list[Trajectory]] = {p.name: [] for p in panels(rt.cfg, list(rt.eval_tasks))}
  episodes = []
  for panel, c, trajs in eval_chunks(rt, params, key):
    by_panel[panel.name] += trajs
    episodes += [dict(panel=panel.name, split=panel.split, temperature=panel.temperature, chunk=c,
                      index=t.group_id, **_episode(t)) for t in trajs]
  m: dict[str, float] = {}
  for name, trajs in by_panel.items():
    m.update(report.rollout_metrics(trajs, f"eval/{name}"))
    m.update({f"eval/{name}/success/{fam}": v for fam, v in family_success(trajs).items()})
  return m, episodes


def eval_key(cfg, done: int) -> jax.Array:
  """The random key of the evaluation after `done` updates (the eval stage reuses it for a checkpoint)."""
  return jax.random.fold_in(jax.random.key(cfg.seed + 1), done)


def evaluate_record(rt: Player, writer: MetricsWriter, params, done: int) -> dict[str, Any]:
  """Evaluates `params` after `done` updates and writes it as its own record at step `done`, and its episodes
  as the dump eval_episodes at step `done`."""
  t0 = time.time()
  m, episodes = evaluate(rt, params, eval_key(rt.cfg, done))
  m["eval/updates_done"] = done
  m["time/eval_s"] = time.time() - t0
  out = writer.write(done, m)
  writer.dump_jsonl(EPISODE_DUMP, done, episodes)
  splits = " ".join(f"{p.name} {out.get(f'eval/{p.name}/success', float('nan')):.3f}"
                    for p in panels(rt.cfg, list(rt.eval_tasks)))
  log.info("eval after %d updates: success %s | %.0fs", done, splits, m["time/eval_s"])
  return out


def checkpoint_dir(path: str) -> str:
  """A run's workdir (holding checkpoints/) or the checkpoints folder itself."""
  inner = os.path.join(path, "checkpoints")
  return inner if os.path.isdir(inner) else path


def source(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
  """What is evaluated and how: the workdir's episodes are valid only for the same source and settings
  (`temperatures` only when eval.temperatures is set, so a workdir from before it stays valid)."""
  src = dict(model=cfg.model.path, checkpoint=os.path.abspath(checkpoint_dir(cfg.eval.checkpoint))
             if cfg.eval.checkpoint else "", step=cfg.eval.checkpoint_step, env=cfg.env.name,
             split=cfg.eval.split, max_tasks=cfg.eval.max_tasks, temperature=cfg.eval.temperature,
             max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed)
  if cfg.eval.get("temperatures"):
    src["temperatures"] = list(temperatures(cfg))
  if cfg.eval.get("draws"):
    src["draws"] = cfg.eval.draws
  return src


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
    except ckpt_lib.DamagedCheckpointError as e:
      raise EvalSourceError(f"checkpoint {folder} step {step if step is not None else ckpt.latest_step()} is "
                            f"damaged: {e}") from None
    except (ValueError, TypeError) as e:  # another architecture: Orbax names the mismatching arrays
      raise EvalSourceError(f"checkpoint {folder} does not fit {cfg.model.path}: {str(e).splitlines()[0]}") from None
    done = step if step is not None else ckpt.latest_step()
  return state.params, int(done), f"checkpoint {folder} step {done}"


def _episode(t) -> dict[str, Any]:
  return dict(task_id=t.task.task_id, family=t.task.family or "all", success=bool(t.success),
              ret=float(t.episode_return), score=float(t.score), length=t.length, termination=t.termination,
              invalid=sum(not s.action_valid for s in t.steps), steps=len(t.steps))


def _panel_name(chunk: dict[str, Any]) -> str:
  return chunk.get("panel", chunk["split"])  # chunks written before eval.temperatures name only their split


def table(chunks: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
  """{panel: {family | "overall": {episodes, success, return, score, invalid_action_rate, env_errors}}} (score:
  the env's own progress measure, WebShop's task score, the paper's main WebShop column; a panel is a
  split, tagged <split>_t<T> for the temperatures after the first); env errors count as episodes but not in the
  rates (as in training's evaluations)."""
  out: dict[str, dict[str, dict[str, float]]] = {}
  for split in dict.fromkeys(map(_panel_name, chunks)):
    eps = [e for c in chunks if _panel_name(c) == split for e in c["episodes"]]
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
          score=float(np.mean([e.get("score", np.nan) for e in good])) if good else 0.0,  # nan: chunks before it
          invalid_action_rate=sum(e["invalid"] for e in good) / steps if steps else 0.0)
  return out


def markdown(results: dict[str, Any]) -> str:
  src = results["source"]
  temps = f"temperature {src['temperature']}"
  if len(src.get("temperatures", ())) > 1:
    temps += "; rows <split>_t<T> at temperature T"
  lines = [f"Evaluation of {results['evaluated']} on {src['env']} ({temps}, no skills).", "",
           "| split | family | episodes | success | return | score | invalid actions | env errors |",
           "|---|---|---|---|---|---|---|---|"]
  for split, fams in results["table"].items():
    for fam, r in fams.items():
      name = f"**{fam}**" if fam == "overall" else fam
      lines.append(f"| {split} | {name} | {r['episodes']} | {r['success']:.3f} | {r['ret']:.3f} | "
                   f"{r.get('score', float('nan')):.3f} | {r['invalid_action_rate']:.3f} | {r['env_errors']} |")
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
  rt = build_player(cfg)  # [scale] joins a multi-process job: each process plays its share of every chunk
  writer = distributed.is_writer()  # only process 0 reads and writes the workdir's files
  try:
    params, updates_done, evaluated = load_params(rt, cfg)
    if writer:
      with open(meta_path, "w") as f:
        json.dump(src, f, indent=1)
    # a chunk cut off by a kill is played again; every process skips what process 0 has
    chunks = distributed.allgather_objects(records.read_records(episodes_path, repair=True) if writer else None)[0]
    done = {(_panel_name(c), c["chunk"]) for c in chunks}
    if done:
      log.info("eval: %d chunks already played in %s", len(done), episodes_path)
    key = eval_key(cfg, updates_done)  # the draws of the run's own evaluation of these weights
    for panel, c, trajs in eval_chunks(rt, params, key, skip=lambda name, c: (name, c) in done):
      chunks.append(dict(split=panel.split, panel=panel.name, temperature=panel.temperature, chunk=c,
                         fingerprint=report.fingerprint(trajs), episodes=[_episode(t) for t in trajs]))
      if writer:
        records.append_records(episodes_path, chunks[-1:])
      log.info("eval: %s chunk %d: success %.3f over %d episodes", panel.name, c,
               np.mean([e["success"] for e in chunks[-1]["episodes"]]), len(trajs))
  finally:
    rt.close()
  order = {p.name: i for i, p in enumerate(panels(cfg, list(rt.eval_tasks)))}
  chunks.sort(key=lambda c: (order[_panel_name(c)], c["chunk"]))
  results = dict(evaluated=evaluated, source=src, table=table(chunks))
  if writer:
    with open(os.path.join(workdir, RESULTS + ".json"), "w") as f:
      json.dump(results, f, indent=1)
    with open(os.path.join(workdir, RESULTS + ".md"), "w") as f:
      f.write(markdown(results))
  return results
