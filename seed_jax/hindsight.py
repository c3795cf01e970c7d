"""The honest hindsight annotator: skills that state only what a trajectory itself shows, so that a policy
taught to write them can write them about its own episodes, which come without a gold path.

A success yields the workflow of its key actions (as the oracle writes it, `sft_oracle.workflow_analysis`).
A failure yields a count of its mistakes and one rule at the first of them, read from the trajectory alone:
  invalid   a reply that was not a valid action (Step.action_valid False, Step.info["invalid_reason"])
  rejected  an action the environment did not understand (the next observation is a rejection)
  repeat    an action done again right after it left the observation unchanged
  loop      an action done again in a state the agent came back to, where it had done it before
  ended     (no mistake before) the last action ended the episode without success
and with no mistake at all, the actions it tried. An episode cut by the step limit also names the places and the
task's objects its observations showed but that it never went to or acted on.

Quotes are the trajectory's own text (observations as `sft_oracle.quote` clips them, actions as `sft_oracle.norm`
writes them); `unseen_mentions` checks that, and the warm start asserts it on every record.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from seed_jax import sft_oracle as oracle
from seed_jax import skills
from seed_jax.envs.base import Trajectory

MAX_NAMED = 2  # places / task objects named after a cut episode, at most this many each (short skills)
_QUOTED = re.compile(r'"([^"]*)"')
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
# A place the observation points to (group 1: its direction, if any; group 2: its name), and the place the agent
# is in: the phrasing of TextWorldExpress ("To the North you see the pantry.", "You are in the kitchen.") and of
# ScienceWorld ("A door to the kitchen (that is open)", "This room is called the hallway.").
_PLACE_SEEN = (re.compile(r"to the (\w+) you see (the [a-z][a-z ]*?) ?[.,]"),
               re.compile(r"a door to ()(the [a-z][a-z ]*?) ?[.,(]"))
_PLACE_HERE = (re.compile(r"you are in (the [a-z][a-z ]*?) ?[.,]"),
               re.compile(r"this room is called (the [a-z][a-z ]*?) ?[.,]"))
# What may follow an object's noun ("a coin.", "a fridge that is closed"; not "the living room").
_PHRASE_END = r"(?=\s*(?:[.,;:!?(]|$)|\s+(?:that|which|with|is|on|in)\b)"
# Task-description words that do not name an object.
_NOT_OBJECTS = frozenset("your task the and then once you are for with from into onto that this there when where "
                         "find take search environment until after before".split())


@dataclasses.dataclass(frozen=True)
class Mistake:
  kind: str  # "invalid" | "rejected" | "repeat" | "loop" | "ended"
  step: int  # index of the step
  earlier: int = -1  # repeat / loop: the last earlier step with the same observation and action


def mistakes(traj: Trajectory) -> list[Mistake]:
  """Every invalid reply, rejected action and repeated (observation, action) pair, in step order."""
  out, done_at = [], {}
  for k, step in enumerate(traj.steps):
    if not step.action_valid:
      out.append(Mistake("invalid", k))
    elif oracle.rejected(oracle.observation_after(traj, k)):
      out.append(Mistake("rejected", k))
    else:
      pair = (oracle.norm(step.observation), oracle.norm(step.action))
      if pair in done_at:  # the same state again (else the pair's observation differs) and the same action
        j = done_at[pair]
        out.append(Mistake("repeat" if j == k - 1 else "loop", k, j))
      done_at[pair] = k
  return out


def _action(action: str) -> str:
  return oracle.quote(oracle.norm(action))


def _sign(observation: str) -> str:
  """An observation's first sentence, the warning sign a rule quotes: what tells the state apart in the
  simulators' texts ("You are in the kitchen."), short enough for a small model to copy."""
  return oracle.quote(_SENTENCE_END.split(observation.strip(), maxsplit=1)[0])


def _rule(traj: Trajectory, m: Mistake) -> str:
  step, k = traj.steps[m.step], m.step + 1
  seen, act = _sign(step.observation), _action(step.action)
  if m.kind == "invalid":
    reason = step.info.get("invalid_reason") or "invalid"
    return (f"Always reply with one valid action in the required format: your reply at step {k} was not valid "
            f"({reason}).")
  if m.kind == "rejected":
    return f'When you see "{seen}", do not do "{act}": at step {k} the environment did not understand it.'
  if m.kind == "repeat":
    return f'When you see "{seen}", do not repeat "{act}": at step {m.earlier + 1} it did not change the observation.'
  if m.kind == "loop":
    return (f'When you see "{seen}" again, try an action you have not tried there: you already did "{act}" there at '
            f"step {m.earlier + 1}.")
  return f'When you see "{seen}", do not do "{act}": at step {k} it ended the episode without success.'


def _matches(patterns: Sequence[re.Pattern], texts: Sequence[str]) -> list[tuple[str, ...]]:
  return [m.groups() for text in texts for p in patterns for m in p.finditer(text)]


def _names(found: Sequence[str]) -> str:
  return " and ".join(f'"{n}"' for n in found)


def _first(names: Sequence[str]) -> list[str]:
  return list(dict.fromkeys(names))[:MAX_NAMED]


def unexplored(traj: Trajectory) -> str:
  """Places the observations pointed to that the agent was never in nor headed for (no action names the place
  or its direction), and objects the task names that an observation showed but no action mentions; "" if none."""
  seen = [oracle.norm(s.observation) for s in traj.steps]
  actions = " | ".join(oracle.norm(s.action) for s in traj.steps)
  mentioned = lambda word: bool(word) and re.search(rf"\b{re.escape(word)}\b", actions) is not None
  here = {place for (place,) in _matches(_PLACE_HERE, seen)}
  places = _first(p for d, p in _matches(_PLACE_SEEN, seen)
                  if p not in here and not mentioned(d) and not mentioned(p.split()[-1]))
  words = dict.fromkeys(w for w in re.findall(r"[a-z]{3,}", oracle.norm(traj.task_description))
                        if w not in _NOT_OBJECTS and not mentioned(w))
  objects = _first(m.group(0) for w in words for text in seen
                   for m in [re.search(rf"\b(?:a|an|the|some) (?:[a-z]+ )?{w}{_PHRASE_END}", text)] if m)
  out = []
  if places:
    out.append(f"You saw {_names(places)} but never went there.")
  if objects:
    them = "it" if len(objects) == 1 else "them"
    out.append(f"You saw {_names(objects)}, which the task names, but never acted on {them}.")
  return " ".join(out)


def _failure_summary(traj: Trajectory, found: Sequence[Mistake]) -> str:
  count = lambda *kinds: sum(m.kind in kinds for m in found)
  return (f"The agent failed ({traj.termination}, {traj.length} steps) with {count('invalid')} invalid replies, "
          f"{count('rejected')} rejected actions and {count('repeat', 'loop')} repeated actions.")


def hindsight_analysis(traj: Trajectory, success_threshold: float = 1.0) -> tuple[str, str] | None:
  """(episode_summary, episode_skill) from the trajectory alone, or None when it shows nothing to learn from (no
  step, an env error, a success without a key action)."""
  if not traj.steps or traj.termination == "env_error":
    return None
  if skills.is_success(traj, success_threshold):
    return oracle.workflow_analysis(traj)
  found = mistakes(traj)
  first = found[0] if found else Mistake("ended", traj.length - 1) if traj.termination == "done" else None
  if first:
    rule = _rule(traj, first)
  else:
    tried = oracle.numbered(oracle.key_actions(traj))
    rule = (f"These actions did not finish the task in {traj.length} steps: {tried}. Go on from there instead of "
            "repeating them.")
  hint = unexplored(traj) if traj.termination == "max_steps" else ""
  return _failure_summary(traj, found), f"{rule} {hint}".strip()


def hindsight_reply(traj: Trajectory, success_threshold: float = 1.0) -> str:
  """The analysis as the JSON reply an analyzer model would give ("" when there is nothing to say)."""
  out = hindsight_analysis(traj, success_threshold)
  return skills.format_skill_json(*out) if out else ""


def _plain(text: str) -> str:
  return oracle.norm(text.replace('"', "'"))


def shown_texts(traj: Trajectory) -> list[str]:
  """The trajectory's own texts, normalized as quotes are: task description, observations, responses, actions."""
  return [_plain(t) for t in [traj.task_description] +
          [t for s in traj.steps for t in (s.observation, s.response_text, s.action)]]


def unseen_mentions(traj: Trajectory, skill: str) -> list[str]:
  """Every quoted "..." of `skill` that is not part of one of the trajectory's texts (case and spaces ignored;
  a clipped quote's ' ...' ending dropped): what an honest skill never has."""
  texts = shown_texts(traj)
  return [q for q in _QUOTED.findall(skill)
          if not any(_plain(q.removesuffix(oracle.CLIPPED)) in t for t in texts)]
