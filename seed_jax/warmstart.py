"""Policy warm start: supervised fine-tuning on the simulators' gold paths, rendered exactly as RL's step
prompts, mixed with analyzer records, so that RL starts from a policy that answers in the action format and
writes parseable skills.

Demonstrations: every task's gold path is played on the env pool with the rollout's own prompt fitting
(`rollout.fit_prompt`: same template, history window, truncation, chat template); each step becomes a
record (step prompt -> a short reasoning line plus the gold action in the answer tags). The history a later
step shows holds the action as the rollout would store it (the parsed action), so a demo prompt is
byte-identical to the prompt a rollout that played the gold actions renders at that state.

Analyzer records: each demo episode cut to RL's episode length (`env.max_steps`), as RL's analyzer sees it,
analysed by the gold-path oracle (`sft_oracle`), as Stage 1's annotation writes them.

Both kinds go through the packed SFT trainer (`sft.train`) in one run, each repeated by its weight, and the
result is exported as an HF folder. `ensure_warm_policy` caches that export under a folder keyed by every
setting that shapes it, so a second run reuses it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from typing import Any, Sequence

import ml_collections
import tqdm

from seed_jax import records as records_lib
from seed_jax import sft_oracle, skills, templates
from seed_jax.envs import get_family
from seed_jax.envs.base import EnvError, Step, Task, Trajectory
from seed_jax.envs.pool import EnvPool
from seed_jax.models import load
from seed_jax.models import tokenizer as tokenizer_lib
from seed_jax.rollout import fit_prompt
from seed_jax.tasks import spread

log = logging.getLogger(__name__)

RECORDS_FILE = "warmstart_records.jsonl"
EXPORT_DIR = "export"
DONE_FILE = "warmstart_stats.json"
# The config sections whose values change what the warm start trains on or how: the cache key.
_KEY_FIELDS = ("model.path", "model.tokenizer", "model.max_prompt_tokens", "env", "warmstart", "sft", "seed",
               "analyzer.max_prompt_tokens", "analyzer.success_threshold")


def demo_response(action: str, reasoning: bool = True) -> str:
  """The demonstrated reply: one short reasoning line (unless `reasoning` is off), then the action in its answer
  tags (an action that already carries its tags, such as Search-QA's `<answer>...</answer>`, is used as is)."""
  action = action.strip()
  block = action if action.startswith("<") else f"<action>{action}</action>"
  return f"<think>The next step toward the goal is: {_untag(action)}.</think>{block}" if reasoning else block


def _untag(action: str) -> str:
  if action.startswith("<") and ">" in action:
    return action[action.index(">") + 1:action.rindex("<")] if "</" in action else action
  return action


def check_gold_paths(cfg: ml_collections.ConfigDict) -> None:
  """Demonstrations need gold paths: one clear error, before any env starts, for a family without them."""
  family = get_family(cfg.env.name)
  if not family.has_gold_paths:
    raise ValueError(f"environment {family.name!r} has no gold paths, so a warm start from demonstrations cannot "
                     "run there: set warmstart.before_rl=False, or warm-start on an environment with gold paths "
                     "and start from its export (--config.model.path=...)")


def play_demos(pool: EnvPool, family, env_cfg: Any, tokenizer: tokenizer_lib.Tokenizer, tasks: Sequence[Task], *,
               max_prompt_tokens: int, max_steps: int,
               reasoning: bool = True) -> tuple[list[Trajectory], list[list[str]]]:
  """Plays each task's gold path (at most `max_steps` steps), `pool.num_envs` tasks at a time, rendering each
  step prompt as the rollout does. Returns the demo trajectories (tasks without a gold path or whose env
  failed are left out) and their gold paths."""
  trajs: list[Trajectory] = []
  golds: list[list[str]] = []
  bar = tqdm.tqdm(total=len(tasks), desc="warm start: gold paths", unit="task", leave=False)
  for start in range(0, len(tasks), pool.num_envs):
    chunk = list(tasks[start:start + pool.num_envs])
    live: dict[int, tuple[Trajectory, Any, list[tuple[str, str]], list[str]]] = {}
    for i, (task, obs) in enumerate(zip(chunk, pool.reset(chunk))):
      gold = None if isinstance(obs, EnvError) else pool.gold_actions(i)
      if gold and not isinstance(gold, EnvError):
        traj = Trajectory(task=task, group_id=start + i, traj_id=0, steps=[], task_description=obs.task_description)
        live[i] = (traj, obs, [], list(gold))
    finished: list[tuple[Trajectory, list[str]]] = []
    for t in range(max_steps):
      actions = {}
      for i, (traj, obs, history, gold) in list(live.items()):
        if t >= len(gold):
          traj.termination = "max_steps"
          finished.append((traj, gold))
          del live[i]
          continue
        fitted = fit_prompt(family, env_cfg, tokenizer, traj.task_description, history, obs, max_prompt_tokens)
        if fitted is None:
          traj.termination = "context_overflow"
          finished.append((traj, gold))
          del live[i]
          continue
        text, ids, truncated, _ = fitted
        traj.truncated_prompts += int(truncated)
        response = demo_response(gold[t], reasoning)
        parsed = family.parse_action(response, env_cfg)
        if not parsed.valid:
          raise ValueError(f"{family.name}: the demonstrated reply {response!r} does not parse as a valid action "
                           f"({parsed.reason})")
        traj.steps.append(Step(prompt_text=text, prompt_tokens=ids, response_text=response, response_tokens=[],
                               logps=[], observation=obs.text, action=parsed.action, action_valid=True))
        actions[i] = parsed.action
      for i, res in pool.step(actions).items():
        traj, obs, history, gold = live[i]
        if isinstance(res, EnvError):  # a demo cut short by a crashed env is dropped, not half-used
          log.warning("warm start: %s: %s; demo dropped", traj.task.task_id, res)
          del live[i]
          continue
        step = traj.steps[-1]
        step.reward, step.done = float(res.reward), bool(res.done)
        traj.episode_return += step.reward
        traj.score = float(res.info.get("score", traj.score))
        history.append((obs.text, step.action))
        live[i] = (traj, res.observation, history, gold)
        if res.done:
          traj.success, traj.termination = bool(res.info.get("success", False)), "done"
          finished.append((traj, gold))
          del live[i]
    for traj, _, _, gold in live.values():
      traj.termination = "max_steps"
      finished.append((traj, gold))
    finished.sort(key=lambda tg: tg[0].group_id)
    trajs += [t for t, _ in finished]
    golds += [g for _, g in finished]
    bar.update(len(chunk))
  bar.close()
  return trajs, golds


def rl_view(traj: Trajectory, max_steps: int) -> Trajectory:
  """The demo as an RL episode of at most `max_steps` steps sees it (what RL's analyzer is given)."""
  if traj.length <= max_steps:
    return traj
  steps = traj.steps[:max_steps]
  return dataclasses.replace(traj, steps=steps, episode_return=sum(s.reward for s in steps), success=False,
                             termination="max_steps")


def build_records(trajs: Sequence[Trajectory], golds: Sequence[Sequence[str]], cfg: ml_collections.ConfigDict,
                  tokenizer: tokenizer_lib.Tokenizer) -> list[dict]:
  """Policy records (every demo step) and analyzer records (oracle replies on the RL-length view), each
  repeated by its weight in `cfg.warmstart`."""
  wc = cfg.warmstart
  policy = [dict(kind="policy", task_id=t.task.task_id, step=k, prompt=s.prompt_text, response=s.response_text)
            for t in trajs for k, s in enumerate(t.steps)]
  analyzer = []
  if wc.analyzer_weight:
    count = lambda s: len(tokenizer.encode_chat(s))
    thr = cfg.analyzer.success_threshold
    for t, gold in zip(trajs, golds):
      view = rl_view(t, cfg.env.max_steps)
      reply = sft_oracle.oracle_reply(view, gold, thr)
      if reply:
        prompt = skills.analysis_prompt_fitted(view, count, cfg.analyzer.max_prompt_tokens, thr)
        analyzer.append(dict(kind="analyzer", task_id=t.task.task_id, step=-1, prompt=prompt, response=reply))
  return policy * wc.policy_weight + analyzer * wc.analyzer_weight


def demo_tasks(cfg: ml_collections.ConfigDict) -> list[Task]:
  """`warmstart.num_tasks` training tasks spread evenly over the train panel (so every task family shows)."""
  panel = get_family(cfg.env.name).tasks(cfg.env, cfg.env.train_split)
  return spread(panel, cfg.warmstart.num_tasks)


def write_records(cfg: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Plays the demos and writes the SFT records to <workdir>/warmstart_records.jsonl at once (temporary file
  + rename), unless a complete file is already there."""
  check_gold_paths(cfg)
  path = os.path.join(workdir, RECORDS_FILE)
  if os.path.exists(path):
    records = records_lib.read_records(path)
    log.info("warm start: %d records already in %s", len(records), path)
    return _stats(records)
  family = get_family(cfg.env.name)
  tok = load.load_tokenizer(cfg.model.tokenizer or cfg.model.path)
  tasks = demo_tasks(cfg)
  max_steps = cfg.warmstart.max_steps or cfg.env.max_steps
  with EnvPool(family, cfg.env, max(1, min(cfg.warmstart.envs, len(tasks)))) as pool:
    trajs, golds = play_demos(pool, family, cfg.env, tok, tasks, max_prompt_tokens=cfg.model.max_prompt_tokens,
                              max_steps=max_steps, reasoning=cfg.warmstart.reasoning)
  if not trajs:
    raise ValueError(f"environment {cfg.env.name!r} gave no gold path for any of {len(tasks)} demo tasks")
  records = build_records(trajs, golds, cfg, tok)
  records_lib.write_records(path, records)
  stats = _stats(records)
  stats["warmstart/demo_tasks"] = float(len(trajs))
  stats["warmstart/demo_success"] = sum(t.success for t in trajs) / len(trajs)
  log.info("warm start: %d demo episodes -> %d records in %s", len(trajs), len(records), path)
  return stats


def _stats(records: Sequence[dict]) -> dict[str, float]:
  return {"warmstart/policy_records": float(sum(r["kind"] == "policy" for r in records)),
          "warmstart/analyzer_records": float(sum(r["kind"] == "analyzer" for r in records))}


def sft_config(cfg: ml_collections.ConfigDict, workdir: str) -> ml_collections.ConfigDict:
  """The run's config with the SFT stage reading the warm-start records and exporting into the workdir."""
  c = ml_collections.ConfigDict(cfg.to_dict())
  c.sft.data = os.path.join(workdir, RECORDS_FILE)
  c.sft.export_dir = os.path.join(workdir, EXPORT_DIR)
  return c


def run(cfg: ml_collections.ConfigDict, workdir: str, mesh=None) -> dict[str, Any]:
  """Demos -> records -> packed SFT -> HF export; resumable (records are kept, SFT resumes from its
  checkpoints). Returns the stats and the export folder."""
  from seed_jax import sft
  stats = write_records(cfg, workdir)
  out = sft.train(sft_config(cfg, workdir), workdir, mesh)
  stats.update(out["metrics"])
  return {"metrics": stats, "export_dir": out["export_dir"]}


def cache_key(cfg: ml_collections.ConfigDict) -> str:
  """A short hash of every setting that shapes the warm-started weights."""
  d = cfg.to_dict()
  d["warmstart"] = {k: v for k, v in d["warmstart"].items() if k not in ("before_rl", "cache_dir")}
  picked = {}
  for field in _KEY_FIELDS:
    node = d
    for part in field.split("."):
      node = node.get(part) if isinstance(node, dict) else None
    picked[field] = node
  if custom := templates.fingerprint(cfg.get("templates", {})):  # replaced prompts, by content; defaults add nothing
    picked["templates"] = custom
  blob = json.dumps(picked, sort_keys=True, default=str).encode()
  return hashlib.sha256(blob).hexdigest()[:12]


def cache_dir(cfg: ml_collections.ConfigDict) -> str:
  root = cfg.warmstart.cache_dir or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                 os.path.join(os.path.expanduser("~"), ".cache"), "seed_jax",
                                                 "warmstart")
  return os.path.join(root, f"{cfg.env.name}-{cache_key(cfg)}")


def is_cached(cfg: ml_collections.ConfigDict) -> bool:
  """Whether this config's warm-started policy is complete in the cache."""
  return os.path.exists(os.path.join(cache_dir(cfg), DONE_FILE))


def ensure_warm_policy(cfg: ml_collections.ConfigDict, mesh=None) -> str:
  """The warm-started policy's HF folder for this config: reused from the cache when it is complete, else
  trained there first (an interrupted warm start resumes)."""
  folder = cache_dir(cfg)
  export, done = os.path.join(folder, EXPORT_DIR), os.path.join(folder, DONE_FILE)
  if os.path.exists(done):
    print(f"seed_jax: warm-started policy from the cache, {export}")
    return export
  print(f"seed_jax: warm start (gold-path demos + analyzer records, SFT) into {folder}")
  out = run(cfg, folder, mesh)
  with open(done, "w") as f:  # written last: a folder without it is an unfinished warm start, resumed next time
    json.dump(out["metrics"], f, indent=2, default=float)
  from seed_jax import sft
  shutil.rmtree(os.path.join(folder, sft.CHECKPOINT_DIR), ignore_errors=True)  # the export is what the cache keeps
  return out["export_dir"]


def with_warm_policy(cfg: ml_collections.ConfigDict, mesh=None) -> ml_collections.ConfigDict:
  """The config with model.path on the (cached) warm-started policy: RL's actor, analyzer and KL reference."""
  c = ml_collections.ConfigDict(cfg.to_dict())
  c.model.path, c.model.tokenizer = ensure_warm_policy(cfg, mesh), ""
  c.warmstart.before_rl = False
  return c
