"""The multi-turn loop: every active env renders its single-turn prompt, one batched sampler call answers
all of them, responses are parsed into actions and the pool steps the envs in parallel.

Each step becomes a `Step` (an independent step-sample: prompt, response, sampled log-probs); each episode a
`Trajectory` ending in "done", "max_steps", "env_error" or "context_overflow".
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import ml_collections

from seed_jax import images as images_lib
from seed_jax.envs import prompting
from seed_jax.infra import distributed
from seed_jax.envs.base import EnvError, EnvFamily, Observation, Step, Task, Trajectory
from seed_jax.models import tokenizer as tokenizer_lib
from seed_jax.models.tokenizer import Tokenizer
from seed_jax.sample import Generation

# (prompt token lists, PRNG key, one images.Image or None per prompt or None, row ids) -> one Generation per prompt
GenerateFn = Callable[..., list[Generation]]


@dataclasses.dataclass
class _Episode:
  traj: Trajectory
  obs: Observation | None
  history: list[tuple[str, str]]
  active: bool = True


class FittedPrompt(NamedTuple):
  text: str
  ids: list[int]  # chat-templated
  truncated: bool  # fewer than history_length pairs shown to fit
  skill_at: int | None  # where H(h, s) puts the skill block (skill_placement "placeholder"), else None


def frame_of(env_cfg: Any, obs: Observation):
  """The observation's RGB frame when the env shows images (env.observation "image"), else None."""
  if env_cfg.get("observation", "text") != "image":
    return None
  if obs.info.get("image") is None:
    raise ValueError("env.observation='image' but the observation has no frame: set env.render_image=True")
  return obs.info["image"]


def fit_prompt(family: EnvFamily, env_cfg: Any, tokenizer: Tokenizer, task_description: str,
               history: Sequence[tuple[str, str]], obs: Observation, max_tokens: int) -> FittedPrompt | None:
  """The step prompt showing the last `history_length` pairs of the whole episode `history`, showing fewer
  (oldest dropped first) while it exceeds `max_tokens`; None if even no history fits. With image observations
  only the current frame enters the prompt (past observations are text)."""
  shown = min(env_cfg.history_length, len(history))
  frame = frame_of(env_cfg, obs)
  for window in range(shown, -1, -1):
    cfg = env_cfg
    if window != env_cfg.history_length:
      cfg = ml_collections.ConfigDict(env_cfg.to_dict())
      cfg.history_length = window
    text, skill_at = prompting.split_skill_slot(family.render_prompt(task_description, history, obs, cfg))
    ids = tokenizer_lib.encode_chat(tokenizer, text, frame)
    if len(ids) <= max_tokens:
      return FittedPrompt(text, ids, window < shown, skill_at)
  return None


def run_episodes(pool, family: EnvFamily, env_cfg: Any, tasks: Sequence[Task], group_ids: Sequence[int],
                 traj_ids: Sequence[int], generate: GenerateFn, tokenizer: Tokenizer, key, *,
                 max_prompt_tokens: int, max_steps: int | None = None,
                 clock: dict[str, float] | None = None, episode_ids: Sequence[int] | None = None) -> list[Trajectory]:
  """Plays tasks[i] on pool env i until done or `max_steps` (default env_cfg.max_steps). Episode i samples
  with row id episode_ids[i] (default i; sample.row_keys), so its draws do not depend on which episodes share
  its calls. With several processes each plays its own episodes and the steps' generate calls are collective:
  a process whose episodes have all ended keeps taking part until every process's have. `clock`, if given,
  gains the seconds spent in the pool (reset and steps: "env_s") and in `generate` ("generate_s")."""
  clock = {} if clock is None else clock
  tick = lambda name, t0: clock.__setitem__(name, clock.get(name, 0.0) + time.perf_counter() - t0)
  if len(tasks) > pool.num_envs:
    raise ValueError(f"{len(tasks)} episodes need {len(tasks)} envs but the pool has {pool.num_envs}")
  max_steps = env_cfg.max_steps if max_steps is None else max_steps
  episode_ids = list(range(len(tasks))) if episode_ids is None else list(episode_ids)
  episodes = []
  t0 = time.perf_counter()
  reset = pool.reset(list(tasks)) if tasks else []
  tick("env_s", t0)
  for i, (task, obs) in enumerate(zip(tasks, reset)):
    traj = Trajectory(task=task, group_id=int(group_ids[i]), traj_id=int(traj_ids[i]), steps=[])
    ep = _Episode(traj=traj, obs=None, history=[])
    if isinstance(obs, EnvError):
      traj.termination, ep.active = "env_error", False
      traj.info["env_error"] = str(obs)
    else:
      ep.obs, traj.task_description = obs, obs.task_description
    episodes.append(ep)

  for t in range(max_steps):
    live = [i for i, ep in enumerate(episodes) if ep.active]
    if not distributed.any_process(bool(live)):
      break
    prompts: dict[int, FittedPrompt] = {}
    for i in live:
      ep = episodes[i]
      fitted = fit_prompt(family, env_cfg, tokenizer, ep.traj.task_description, ep.history, ep.obs, max_prompt_tokens)
      if fitted is None:
        ep.traj.termination, ep.active = "context_overflow", False
        continue
      ep.traj.truncated_prompts += int(fitted.truncated)
      prompts[i] = fitted
    order = list(prompts)
    t0 = time.perf_counter()
    frames = [frame_of(env_cfg, episodes[i].obs) for i in order]  # what fit_prompt encoded
    gens = generate([prompts[i].ids for i in order], jax.random.fold_in(key, t), images_lib.prepare(tokenizer, frames),
                    [episode_ids[i] for i in order])
    tick("generate_s", t0)
    actions = {}
    for i, gen, frame in zip(order, gens, frames):
      ep = episodes[i]
      response = tokenizer.decode(gen.tokens)
      parsed = family.parse_action(response, env_cfg)
      actions[i] = parsed.action
      info = {"invalid_reason": parsed.reason, "stop_reason": gen.stop_reason}
      if prompts[i].skill_at is not None:
        info["skill_at"] = prompts[i].skill_at
      ep.traj.steps.append(Step(
          prompt_text=prompts[i].text, prompt_tokens=prompts[i].ids, response_text=response,
          response_tokens=list(gen.tokens), logps=list(gen.logps), observation=ep.obs.text, action=parsed.action,
          action_valid=parsed.valid, info=info, image=frame))
    t0 = time.perf_counter()
    results = pool.step(actions) if actions else {}
    tick("env_s", t0)
    for i, res in results.items():
      ep = episodes[i]
      step = ep.traj.steps[-1]
      if isinstance(res, EnvError):
        ep.traj.termination, ep.active = "env_error", False
        ep.traj.info["env_error"] = str(res)
        continue
      step.reward, step.done = float(res.reward), bool(res.done)
      step.info.update({k: v for k, v in res.info.items() if k in ("success", "score", "truncated")})
      ep.traj.episode_return += step.reward
      ep.traj.score = float(res.info.get("score", ep.traj.score))
      ep.history.append((ep.obs.text, step.action))
      ep.obs = res.observation
      if res.done:
        ep.active = False
        ep.traj.success = bool(res.info.get("success", False))
        ep.traj.termination = "max_steps" if res.info.get("truncated") else "done"
  for ep in episodes:
    if ep.active:
      ep.traj.termination = "max_steps"
  return [ep.traj for ep in episodes]
