"""The oracle analyzer: deterministic hindsight skills from an environment's gold path, so Stage 1 runs
with no external model.

A successful trajectory yields its workflow: its key actions in order (valid actions the environment
accepted, immediate repeats collapsed). A failed trajectory yields an avoidance rule at its first divergence
from the gold path: the action it should have taken there, and the warning sign, which is the observation
the agent saw at that point. Replies use the analyzers' JSON schema (`skills.format_skill_json`).

The oracle is privileged: a failure's rule names the gold action, which the trajectory never shows. The
honest annotator (hindsight.py) writes only what the trajectory shows and reuses the helpers below.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

from seed_jax import skills
from seed_jax.envs.base import EnvError, EnvFamily, Task, Trajectory
from seed_jax.envs.pool import EnvPool

# Replies of the simulators to an action they did not understand (TextWorldExpress, ScienceWorld): such a
# step changed nothing, so it is not part of a workflow.
REJECTED_REPLIES = ("unknown action", "no known action matches")
WARNING_CHARS = 160  # the warning-sign observation is quoted on one line, clipped to this many characters
CLIPPED = " ..."  # ends a clipped quote
_SPACES = re.compile(r"\s+")


def norm(action: str) -> str:
  """An action as skills quote it and as actions are compared: lower case, runs of spaces made one."""
  return _SPACES.sub(" ", action.strip().lower())


def quote(text: str, limit: int = WARNING_CHARS) -> str:
  """`text` on one line with double quotes made single, so it can stand inside "...", clipped to `limit`
  characters (then ending in " ...")."""
  text = _SPACES.sub(" ", text).strip().replace('"', "'")
  return text if len(text) <= limit else text[:limit].rstrip() + CLIPPED


def rejected(observation: str) -> bool:
  """Whether an observation is the simulator's reply to an action it did not understand."""
  return observation.strip().lower().startswith(REJECTED_REPLIES)


def observation_after(traj: Trajectory, k: int) -> str:
  """What step k's action led to, as far as the trajectory shows ("" after its last step)."""
  return traj.steps[k + 1].observation if k + 1 < len(traj.steps) else ""


def key_actions(traj: Trajectory) -> list[str]:
  """Valid actions the env accepted (the next observation is not a rejection), immediate repeats collapsed."""
  out: list[str] = []
  for k, step in enumerate(traj.steps):
    if not step.action_valid or rejected(observation_after(traj, k)):
      continue
    if not out or norm(out[-1]) != norm(step.action):
      out.append(norm(step.action))
  return out


def numbered(actions: Sequence[str]) -> str:
  """`1. a; 2. b; ...`: how a workflow lists its actions."""
  return "; ".join(f"{i}. {a}" for i, a in enumerate(actions, 1))


def workflow_analysis(traj: Trajectory) -> tuple[str, str] | None:
  """A success's (summary, workflow of its key actions); None when it has no key action. It needs no gold path,
  so the honest annotator (hindsight.py) writes successes the same way."""
  actions = key_actions(traj)
  if not actions:
    return None
  return (f"The agent completed the task in {traj.length} steps with {len(actions)} key actions.",
          f"Follow this workflow: {numbered(actions)}. Do the steps in this order, once each, using the names you "
          "observe.")


def first_divergence(traj: Trajectory, gold: Sequence[str]) -> int:
  """Index of the first step whose action differs from the gold path's action at that index; len(steps)
  when every step followed the gold path."""
  for k, step in enumerate(traj.steps):
    if k >= len(gold) or norm(step.action) != norm(gold[k]):
      return k
  return len(traj.steps)


def oracle_analysis(traj: Trajectory, gold: Sequence[str] | None,
                    success_threshold: float = 1.0) -> tuple[str, str] | None:
  """(episode_summary, episode_skill), or None when the gold path cannot say what to do (failed trajectory
  without a gold path, or one that already followed the whole gold path)."""
  n, end = traj.length, traj.termination
  if skills.is_success(traj, success_threshold):
    return workflow_analysis(traj)
  if not gold:
    return None
  k = first_divergence(traj, gold)
  if k >= len(gold):
    return None
  expected = norm(gold[k])
  if k == n:  # every step was on the gold path; the episode ended before it was finished
    summary = (f"The agent failed ({end}, {n} steps) while still on the gold path; the next gold action was "
               f'"{expected}".')
    if not n:
      return summary, f'Start with "{expected}".'
    return summary, f'Do not stop or stall after "{norm(traj.steps[-1].action)}": continue with "{expected}".'
  step = traj.steps[k]
  warning = quote(step.observation)
  if not step.action_valid:
    reason = step.info.get("invalid_reason") or "invalid"
    return (f"The agent failed ({end}, {n} steps); at step {k + 1} its reply was not a valid action ({reason}).",
            f'When you see "{warning}", reply with a valid action in the required format: "{expected}".')
  return (f'The agent failed ({end}, {n} steps); at step {k + 1} it did "{norm(step.action)}" where the gold '
          f'path does "{expected}".',
          f'When you see "{warning}", do "{expected}" instead of "{norm(step.action)}".')


def oracle_reply(traj: Trajectory, gold: Sequence[str] | None, success_threshold: float = 1.0) -> str:
  """The analysis as the JSON reply an analyzer model would give ("" when the oracle has nothing to say)."""
  out = oracle_analysis(traj, gold, success_threshold)
  return skills.format_skill_json(*out) if out else ""


def fetch_gold_paths(family: EnvFamily, env_cfg: Any, tasks: Sequence[Task], num_envs: int,
                     pool: EnvPool | None = None) -> list[list[str] | None]:
  """Each task's gold path from its reset state, `num_envs` tasks reset in parallel (None where the env
  has none or failed)."""
  if not tasks:
    return []
  own = pool is None
  pool = pool or EnvPool(family, env_cfg, max(1, min(num_envs, len(tasks))))
  try:
    out: list[list[str] | None] = []
    for start in range(0, len(tasks), pool.num_envs):
      chunk = list(tasks[start:start + pool.num_envs])
      firsts = pool.reset(chunk)
      for i, first in enumerate(firsts):
        gold = None if isinstance(first, EnvError) else pool.gold_actions(i)
        out.append(None if isinstance(gold, EnvError) or not gold else list(gold))
    return out
  finally:
    if own:
      pool.close()
