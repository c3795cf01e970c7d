"""Policy warm start: supervised fine-tuning on the simulators' gold paths, rendered exactly as RL's step
prompts, mixed with analyzer records, so that RL starts from a policy that answers in the action format and
writes parseable skills.

Demonstrations: every task's gold path is played on the env pool with the rollout's own prompt fitting
(`rollout.fit_prompt`: same template, history window, truncation, chat template); each step becomes a
record (step prompt -> a short reasoning line plus the gold action in the answer tags). The history a later
step shows holds the action as the rollout would store it (the parsed action), so a demo prompt is
byte-identical to the prompt a rollout that played the gold actions renders at that state.

Analyzer records: each demo episode cut to RL's episode length (`env.max_steps`), as RL's analyzer sees it,
analysed by `warmstart.analyzer_source`: "hindsight" (the default, `hindsight.py`) writes only what the
trajectory shows, as the policy must when it analyses its own episodes at RL time; "oracle" (`sft_oracle`) is
privileged, its failure rules name gold actions the trajectory never shows.

Both kinds go through the packed SFT trainer (`sft.train`) in one run, each repeated by its weight, and the
result is exported as an HF folder. Demos are successes (or cut at the step limit), so with
`warmstart.self_play_rollouts` > 0 that first export plays train tasks as RL's rollouts do, its episodes are
annotated by the same source, and a second SFT pass from the base model on the policy records and these analyzer
records (both outcomes, as the policy's own rollouts produce them) gives the warm policy.
`ensure_warm_policy` caches the export under a folder keyed by every setting that shapes it, so a second run
reuses it.
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

from seed_jax import hindsight
from seed_jax import records as records_lib
from seed_jax import report, sft_oracle, shares, skills, stage1, templates
from seed_jax.envs import get_family
from seed_jax.envs.base import EnvError, Step, Task, Trajectory
from seed_jax.envs.pool import EnvPool
from seed_jax.infra import distributed
from seed_jax.models import load
from seed_jax.models import tokenizer as tokenizer_lib
from seed_jax.rollout import fit_prompt
from seed_jax.tasks import spread

log = logging.getLogger(__name__)

RECORDS_FILE = "warmstart_records.jsonl"
EXPORT_DIR = "export"
DONE_FILE = "warmstart_stats.json"
# With self-play: the first SFT pass's workdir (its export plays the episodes), the episodes (stage1.collect's
# resumable log) and the second pass's records.
DEMO_DIR = "demo_sft"
SELF_PLAY_TRAJECTORIES = "self_play_trajectories.jsonl"
SELF_PLAY_RECORDS = "self_play_records.jsonl"
# The config sections whose values change what the warm start trains on or how: the cache key.
_KEY_FIELDS = ("model.path", "model.tokenizer", "model.max_prompt_tokens", "env", "warmstart", "sft", "seed",
               "analyzer.max_prompt_tokens", "analyzer.success_threshold")
# Env settings of how the simulator processes run, not of what they play: left out of the key.
_RUNTIME_ENV_FIELDS = ("jvm_options", "step_timeout_s", "reset_timeout_s", "start_timeout_s")
# ... and with self-play, how the episodes are sampled.
_SELF_PLAY_KEY_FIELDS = ("rollout.temperature", "rollout.top_p", "rollout.top_k", "rollout.max_new_tokens",
                         "rollout.stop_strings", "sampler.dtype")


def demo_response(action: str, reasoning: bool = True, answer_format: str = "tags") -> str:
  """The demonstrated reply: one short reasoning line (unless `reasoning` is off), then the action in its answer
  tags (an action that already carries its tags, such as Search-QA's `<answer>...</answer>`, is used as is);
  with env.answer_format "json" the JSON object {"thoughts": ..., "action": ...}."""
  action = action.strip()
  if answer_format == "json":
    thoughts = {"thoughts": f"The next step toward the goal is: {action}."} if reasoning else {}
    return json.dumps({**thoughts, "action": action})
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
        response = demo_response(gold[t], reasoning, env_cfg.get("answer_format", "tags"))
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


def analyzer_reply(traj: Trajectory, gold: Sequence[str] | None, cfg: ml_collections.ConfigDict) -> str:
  """One analyzer record's target from `warmstart.analyzer_source` ("" when it has nothing to say). A hindsight
  target quoting what its trajectory does not show would teach the policy to invent: that is an error."""
  thr = cfg.analyzer.success_threshold
  if cfg.warmstart.analyzer_source == "oracle":
    return sft_oracle.oracle_reply(traj, gold, thr)
  out = hindsight.hindsight_analysis(traj, thr)
  if out is None:
    return ""
  if unseen := [q for text in out for q in hindsight.unseen_mentions(traj, text)]:
    raise ValueError(f"warm start: the hindsight analysis of task {traj.task.task_id} quotes {unseen}, which its "
                     "trajectory does not show")
  return skills.format_skill_json(*out)


def analyzer_records(trajs: Sequence[Trajectory], golds: Sequence[Sequence[str] | None],
                     cfg: ml_collections.ConfigDict, tokenizer: tokenizer_lib.Tokenizer) -> list[dict]:
  """An analysis prompt -> reply record for each trajectory the source has something to say about, with its
  outcome (`success`)."""
  count = lambda s: len(tokenizer.encode_chat(s))
  thr = cfg.analyzer.success_threshold
  out = []
  for t, gold in zip(trajs, golds):
    if reply := analyzer_reply(t, gold, cfg):
      prompt = skills.analysis_prompt_fitted(t, count, cfg.analyzer.max_prompt_tokens, thr)
      out.append(dict(kind="analyzer", task_id=t.task.task_id, step=-1, prompt=prompt, response=reply,
                      success=skills.is_success(t, thr)))
  return out


def skill_prompt_records(trajs: Sequence[Trajectory], cfg: ml_collections.ConfigDict,
                         tokenizer: tokenizer_lib.Tokenizer) -> list[dict]:
  """Every demo step once more, its prompt carrying the demo's own honest hindsight skill (of the RL-length view)
  where RL's re-score would insert it, the reply unchanged; steps whose H(h, s) exceeds model.max_prompt_tokens
  are left out, as the re-score leaves them without a skill."""
  out = []
  for t in trajs:
    found = hindsight.hindsight_analysis(rl_view(t, cfg.env.max_steps), cfg.analyzer.success_threshold)
    if found is None:
      continue
    for k, s in enumerate(t.steps):
      prompt = skills.augment_prompt(s.prompt_text, found[1], s.info.get("skill_at"))
      if len(tokenizer.encode_chat(prompt)) <= cfg.model.max_prompt_tokens:
        out.append(dict(kind="policy", task_id=t.task.task_id, step=k, prompt=prompt, response=s.response_text,
                        skill=True))
  return out


def build_records(trajs: Sequence[Trajectory], golds: Sequence[Sequence[str]], cfg: ml_collections.ConfigDict,
                  tokenizer: tokenizer_lib.Tokenizer) -> list[dict]:
  """Policy records (every demo step; with `skill_prompt_weight`, also under the demo's skill) and analyzer records
  (the source's replies on the RL-length view), each repeated by its weight in `cfg.warmstart`."""
  wc = cfg.warmstart
  policy = [dict(kind="policy", task_id=t.task.task_id, step=k, prompt=s.prompt_text, response=s.response_text)
            for t in trajs for k, s in enumerate(t.steps)] * wc.policy_weight
  if wc.skill_prompt_weight:
    policy += skill_prompt_records(trajs, cfg, tokenizer) * wc.skill_prompt_weight
  analyzer = []
  if wc.analyzer_weight:
    analyzer = analyzer_records([rl_view(t, cfg.env.max_steps) for t in trajs], golds, cfg, tokenizer)
  return policy + analyzer * wc.analyzer_weight


def demo_tasks(cfg: ml_collections.ConfigDict) -> list[Task]:
  """`warmstart.num_tasks` training tasks spread evenly over the train panel (so every task family shows)."""
  panel = get_family(cfg.env.name).tasks(cfg.env, cfg.env.train_split)
  return spread(panel, cfg.warmstart.num_tasks)


def write_records(cfg: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Plays the demos and writes the SFT records to <workdir>/warmstart_records.jsonl at once (temporary file
  + rename), unless a complete file is already there."""
  check_gold_paths(cfg)
  path = os.path.join(workdir, RECORDS_FILE)
  if (stats := shares.from_writer(lambda: _stats(records_lib.read_records(path)) if os.path.exists(path)
                                  else None)) is not None:
    log.info("warm start: records already in %s", path)
    return stats
  family = get_family(cfg.env.name)
  tok = load.load_tokenizer(cfg.model.tokenizer or cfg.model.path)
  tasks = demo_tasks(cfg)
  max_steps = cfg.warmstart.max_steps or cfg.env.max_steps
  mine = shares.my_tasks(len(tasks))  # with several processes each plays its share of the demos
  with EnvPool(family, cfg.env, max(1, min(cfg.warmstart.envs, len(mine)))) as pool:
    trajs, golds = play_demos(pool, family, cfg.env, tok, [tasks[i] for i in mine],
                              max_prompt_tokens=cfg.model.max_prompt_tokens, max_steps=max_steps,
                              reasoning=cfg.warmstart.reasoning)
  for t in trajs:
    t.group_id = mine[t.group_id]
  played = sorted((pair for part in distributed.allgather_objects(list(zip(trajs, golds))) for pair in part),
                  key=lambda tg: tg[0].group_id)
  trajs, golds = [t for t, _ in played], [g for _, g in played]
  if not trajs:
    raise ValueError(f"environment {cfg.env.name!r} gave no gold path for any of {len(tasks)} demo tasks")

  def write() -> dict[str, float]:
    records = build_records(trajs, golds, cfg, tok)
    records_lib.write_records(path, records)
    log.info("warm start: %d demo episodes -> %d records in %s", len(trajs), len(records), path)
    return _stats(records)
  stats = shares.from_writer(write)
  stats["warmstart/demo_tasks"] = float(len(trajs))
  stats["warmstart/demo_success"] = sum(t.success for t in trajs) / len(trajs)
  return stats


def _stats(records: Sequence[dict]) -> dict[str, float]:
  analyzer = [r for r in records if r["kind"] == "analyzer"]
  return {"warmstart/policy_records": float(len(records) - len(analyzer)),
          "warmstart/analyzer_records": float(len(analyzer)),
          "warmstart/analyzer_success_records": float(sum(bool(r.get("success")) for r in analyzer)),
          "warmstart/analyzer_failure_records": float(sum(not r.get("success") for r in analyzer))}


def self_play_config(cfg: ml_collections.ConfigDict, workdir: str, policy: str) -> ml_collections.ConfigDict:
  """Stage 1's collection config for self-play: `policy` plays `warmstart.self_play_rollouts` train tasks (the
  first of RL's task stream), one episode each, `warmstart.envs` at a time, sampling as RL's rollouts do."""
  c = ml_collections.ConfigDict(cfg.to_dict())
  c.model.path, c.model.tokenizer = policy, ""
  k = c.collect
  k.num_tasks, k.rollouts, k.tasks_per_batch = cfg.warmstart.self_play_rollouts, 1, cfg.warmstart.envs
  k.temperature, k.top_p, k.max_new_tokens = cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens
  k.output = os.path.join(workdir, SELF_PLAY_TRAJECTORIES)
  return c


def self_play_records(cfg: ml_collections.ConfigDict, workdir: str, trajs: Sequence[Trajectory]) -> list[dict]:
  """The second pass's records: the demo policy records, then the analyzer records of the self-play episodes
  (env errors and empty episodes left out, as Stage 1's annotation does)."""
  usable = [t for t in trajs if t.steps and t.termination != "env_error"]
  golds: list = [None] * len(usable)
  if cfg.warmstart.analyzer_source == "oracle":
    golds = sft_oracle.fetch_gold_paths(get_family(cfg.env.name), cfg.env, [t.task for t in usable], cfg.warmstart.envs)
  tok = load.load_tokenizer(cfg.model.tokenizer or cfg.model.path)
  policy = [r for r in records_lib.read_records(os.path.join(workdir, RECORDS_FILE)) if r["kind"] == "policy"]
  return policy + analyzer_records(usable, golds, cfg, tok) * cfg.warmstart.analyzer_weight


def write_self_play_records(cfg: ml_collections.ConfigDict, workdir: str, policy: str,
                            mesh=None) -> dict[str, float]:
  """Plays the self-play episodes of `policy` (stage1.collect: resumable) and writes the second pass's records to
  <workdir>/self_play_records.jsonl at once, unless they are already there. Returns the records' counts and the
  episodes' rollout metrics (warmstart/self_play/*)."""
  path = os.path.join(workdir, SELF_PLAY_RECORDS)
  written = shares.from_writer(lambda: os.path.exists(path))
  if not written:
    stage1.collect(self_play_config(cfg, workdir, policy), workdir, mesh)  # collective
  trajs = [t for _, t in stage1.load_trajectories(os.path.join(workdir, SELF_PLAY_TRAJECTORIES))]
  if not written:  # process 0 searches the gold paths and writes; the others wait for the file
    shares.from_writer(lambda: records_lib.write_records(path, self_play_records(cfg, workdir, trajs)))
  stats = _stats(records_lib.read_records(path))
  stats.update({k: v for k, v in report.rollout_metrics(trajs, "warmstart/self_play").items()
                if not k.endswith("response_tokens")})  # collected episodes keep no token ids
  log.info("warm start: %d self-play episodes (success %.3f, invalid-action rate %.3f) -> %s", len(trajs),
           stats.get("warmstart/self_play/success", 0.0), stats.get("warmstart/self_play/invalid_action_rate", 0.0),
           path)
  return stats


def sft_config(cfg: ml_collections.ConfigDict, workdir: str, data: str = "") -> ml_collections.ConfigDict:
  """The run's config with the SFT stage reading the warm-start records (`data`, default <workdir>/
  warmstart_records.jsonl) and exporting into the workdir."""
  c = ml_collections.ConfigDict(cfg.to_dict())
  c.sft.data = data or os.path.join(workdir, RECORDS_FILE)
  c.sft.export_dir = os.path.join(workdir, EXPORT_DIR)
  return c


def _demo_pass(cfg: ml_collections.ConfigDict, workdir: str, mesh) -> dict[str, Any]:
  """With self-play, the first SFT pass (demo records) in <workdir>/demo_sft; once finished (sft_stats.json is
  written after its export), a resumed warm start reads its stats instead of loading it again."""
  from seed_jax import sft
  folder = os.path.join(workdir, DEMO_DIR)
  c = sft_config(cfg, folder, os.path.join(workdir, RECORDS_FILE))
  done = os.path.join(folder, "sft_stats.json")
  if shares.from_writer(lambda: os.path.exists(done)):
    with open(done) as f:
      return {"metrics": json.load(f), "export_dir": c.sft.export_dir}
  return sft.train(c, folder, mesh)


def run(cfg: ml_collections.ConfigDict, workdir: str, mesh=None) -> dict[str, Any]:
  """Demos -> records -> packed SFT -> HF export, with self-play: -> episodes -> records -> SFT again;
  resumable (records are kept, SFT resumes from its checkpoints). Returns the stats and the export folder."""
  from seed_jax import sft
  if cfg.warmstart.self_play_rollouts < 0:
    raise ValueError(f"config.warmstart.self_play_rollouts={cfg.warmstart.self_play_rollouts} must be >= 0")
  stats = write_records(cfg, workdir)
  data = os.path.join(workdir, RECORDS_FILE)
  if cfg.warmstart.self_play_rollouts:
    demo = _demo_pass(cfg, workdir, mesh)
    # The demo records' counts keep a demo_ prefix; the unprefixed ones count what the warm policy trains on.
    stats = {k.replace("warmstart/", "warmstart/demo_") if k.endswith("_records") else k: v for k, v in stats.items()}
    stats.update({f"demo_{k}": v for k, v in demo["metrics"].items()})
    stats.update(write_self_play_records(cfg, workdir, demo["export_dir"], mesh))
    data = os.path.join(workdir, SELF_PLAY_RECORDS)
  out = sft.train(sft_config(cfg, workdir, data), workdir, mesh)
  stats.update(out["metrics"])
  return {"metrics": stats, "export_dir": out["export_dir"]}


def cache_key(cfg: ml_collections.ConfigDict) -> str:
  """A short hash of every setting that shapes the warm-started weights."""
  d = cfg.to_dict()
  d["warmstart"] = {k: v for k, v in d["warmstart"].items() if k not in ("before_rl", "cache_dir")}
  d["env"] = {k: v for k, v in d["env"].items() if k not in _RUNTIME_ENV_FIELDS}
  picked = {}
  for field in _KEY_FIELDS + (_SELF_PLAY_KEY_FIELDS if cfg.warmstart.self_play_rollouts else ()):
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
  if shares.from_writer(lambda: os.path.exists(done)):
    print(f"seed_jax: warm-started policy from the cache, {export}")
    return export
  plays = " + self-play" if cfg.warmstart.self_play_rollouts else ""
  print(f"seed_jax: warm start (gold-path demos{plays} + analyzer records, SFT) into {folder}")
  out = run(cfg, folder, mesh)  # collective: every process of a pod takes part

  def finish() -> None:
    with open(done, "w") as f:  # written last: a folder without it is an unfinished warm start, resumed next time
      json.dump(out["metrics"], f, indent=2, default=float)
    from seed_jax import sft
    for scratch in (sft.CHECKPOINT_DIR, DEMO_DIR):  # the export is what the cache keeps
      shutil.rmtree(os.path.join(folder, scratch), ignore_errors=True)
  shares.from_writer(finish)
  return out["export_dir"]


def with_warm_policy(cfg: ml_collections.ConfigDict, mesh=None) -> ml_collections.ConfigDict:
  """The config with model.path on the (cached) warm-started policy: RL's actor, analyzer and KL reference."""
  c = ml_collections.ConfigDict(cfg.to_dict())
  c.model.path, c.model.tokenizer = ensure_warm_policy(cfg, mesh), ""
  c.warmstart.before_rl = False
  return c
