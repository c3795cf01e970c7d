"""The multi-turn loop: every active env renders its single-turn prompt, the sampler answers it, the response is
parsed into an action and the pool steps the env. Turn by turn, one batched call answers all of a turn's
prompts and the pool steps those envs in parallel; on rows that refill (seed_jax/slots.py) an episode goes on
as soon as its own reply ends. Both play the same trajectories.

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
from seed_jax import slots
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
                 clock: dict[str, float] | None = None, episode_ids: Sequence[int] | None = None,
                 serve: Callable | None = None) -> list[Trajectory]:
  """Plays tasks[i] on pool env i until done or `max_steps` (default env_cfg.max_steps). Turn t of episode i
  samples with row id episode_ids[i] (default i; sample.row_keys) under fold_in(key, t), so its draws do not
  depend on which episodes share its calls. With several processes each plays its own episodes and the steps'
  generate calls are collective: a process whose episodes have all ended keeps taking part until every
  process's have. `serve` (slots.server), where given: rows that refill, each episode's next turn entering a
  decode slot as soon as its env has stepped, instead of every turn waiting for the turn's longest reply; the
  same trajectories. `clock`, if given, gains the seconds spent in the pool (reset and steps: "env_s") and in
  generation ("generate_s")."""
  clock = {} if clock is None else clock
  if len(tasks) > pool.num_envs:
    raise ValueError(f"{len(tasks)} episodes need {len(tasks)} envs but the pool has {pool.num_envs}")
  play = _Play(pool, family, env_cfg, tokenizer, key, max_prompt_tokens, clock,
               list(range(len(tasks))) if episode_ids is None else list(episode_ids))
  max_steps = env_cfg.max_steps if max_steps is None else max_steps
  t0 = time.perf_counter()
  reset = pool.reset(list(tasks)) if tasks else []
  play.tick("env_s", t0)
  for i, (task, obs) in enumerate(zip(tasks, reset)):
    traj = Trajectory(task=task, group_id=int(group_ids[i]), traj_id=int(traj_ids[i]), steps=[])
    ep = _Episode(traj=traj, obs=None, history=[])
    if isinstance(obs, EnvError):
      traj.termination, ep.active = "env_error", False
      traj.info["env_error"] = str(obs)
    else:
      ep.obs, traj.task_description = obs, obs.task_description
    play.episodes.append(ep)
  if serve is not None:
    play.refilling(serve, max_steps)
  else:
    play.in_turns(generate, max_steps)
  for ep in play.episodes:
    if ep.active:
      ep.traj.termination = "max_steps"
  return [ep.traj for ep in play.episodes]


@dataclasses.dataclass
class _Play:
  """The episodes of one run_episodes call and what a turn does to one of them."""
  pool: Any
  family: EnvFamily
  env_cfg: Any
  tokenizer: Tokenizer
  key: Any
  max_prompt_tokens: int
  clock: dict[str, float]
  episode_ids: list[int]
  episodes: list[_Episode] = dataclasses.field(default_factory=list)

  def tick(self, name: str, t0: float) -> None:
    self.clock[name] = self.clock.get(name, 0.0) + time.perf_counter() - t0

  def prompt(self, i: int) -> FittedPrompt | None:
    """Episode i's next step prompt; None ends it with "context_overflow" when even no history fits."""
    ep = self.episodes[i]
    fitted = fit_prompt(self.family, self.env_cfg, self.tokenizer, ep.traj.task_description, ep.history, ep.obs,
                        self.max_prompt_tokens)
    if fitted is None:
      ep.traj.termination, ep.active = "context_overflow", False
      return None
    ep.traj.truncated_prompts += int(fitted.truncated)
    return fitted

  def record(self, i: int, fitted: FittedPrompt, gen: Generation, frame) -> str:
    """Episode i's step from its reply; returns the parsed action."""
    ep = self.episodes[i]
    response = self.tokenizer.decode(gen.tokens)
    parsed = self.family.parse_action(response, self.env_cfg)
    info = {"invalid_reason": parsed.reason, "stop_reason": gen.stop_reason}
    if fitted.skill_at is not None:
      info["skill_at"] = fitted.skill_at
    ep.traj.steps.append(Step(
        prompt_text=fitted.text, prompt_tokens=fitted.ids, response_text=response,
        response_tokens=list(gen.tokens), logps=list(gen.logps), observation=ep.obs.text, action=parsed.action,
        action_valid=parsed.valid, info=info, image=frame))
    return parsed.action

  def step(self, actions: dict[int, str]) -> None:
    """The pool steps the episodes' envs; each result ends its step (or the episode, on an env error)."""
    t0 = time.perf_counter()
    results = self.pool.step(actions) if actions else {}
    self.tick("env_s", t0)
    for i, res in results.items():
      ep = self.episodes[i]
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

  def in_turns(self, generate: GenerateFn, max_steps: int) -> None:
    """Turn by turn: every live episode's prompt in one generate call, then the pool steps them all."""
    for t in range(max_steps):
      live = [i for i, ep in enumerate(self.episodes) if ep.active]
      if not distributed.any_process(bool(live)):
        break
      prompts = {i: f for i in live if (f := self.prompt(i)) is not None}
      order = list(prompts)
      t0 = time.perf_counter()
      frames = [frame_of(self.env_cfg, self.episodes[i].obs) for i in order]  # what fit_prompt encoded
      gens = generate([prompts[i].ids for i in order], jax.random.fold_in(self.key, t),
                      images_lib.prepare(self.tokenizer, frames), [self.episode_ids[i] for i in order])
      self.tick("generate_s", t0)
      self.step({i: self.record(i, prompts[i], gen, frame) for i, gen, frame in zip(order, gens, frames)})

  def refilling(self, serve: Callable, max_steps: int) -> None:
    """On rows that refill: an episode's reply steps its env at once and its next prompt enters the first free
    decode slot. Turn t of episode i draws with the key the turn-by-turn loop gives it."""
    turns = [0] * len(self.episodes)

    def request(i: int):
      if not self.episodes[i].active or turns[i] >= max_steps:
        return None
      fitted = self.prompt(i)
      if fitted is None:
        return None
      frame = frame_of(self.env_cfg, self.episodes[i].obs)
      image = None if frame is None else images_lib.prepare(self.tokenizer, [frame])[0]
      row_key = jax.random.fold_in(jax.random.fold_in(self.key, turns[i]), self.episode_ids[i])
      return slots.Request(fitted.ids, row_key, image, (i, fitted, frame))

    def on_done(finished):
      self.step({r.tag[0]: self.record(r.tag[0], r.tag[1], gen, r.tag[2]) for r, gen in finished})
      for r, _ in finished:
        turns[r.tag[0]] += 1
      return [q for r, _ in finished if (q := request(r.tag[0])) is not None]

    t0 = time.perf_counter()
    env_before = self.clock.get("env_s", 0.0)
    serve([q for i in range(len(self.episodes)) if (q := request(i)) is not None], on_done)
    self.tick("generate_s", t0)
    self.clock["generate_s"] -= self.clock.get("env_s", 0.0) - env_before  # the env steps inside the call
