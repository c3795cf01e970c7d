"""Prompt rendering and action parsing shared by the text environments.

Every step is a single-turn prompt (SEED_ALGORITHM.md §1): the task line, a window of the last
`history_length` (observation, action) pairs, the current observation, the admissible actions and the
answer-format line. The model answers `<think>...</think><action>...</action>`.
"""
from __future__ import annotations

import re
from typing import Sequence

from seed_jax.envs.base import TASK_LINE_PREFIX, TURN_LINE_PREFIX, ParsedAction

# An unparsable response is still sent to the environment as its last characters, so the episode goes on
# and the env answers with its usual "unknown action" text.
INVALID_TAIL_CHARS = 30

# CJK radicals and punctuation, kana, bopomofo, hangul, unified ideographs (+ ext. A, compatibility, ext. B-G)
# and full-width forms: a small model drifting into Chinese/Japanese/Korean mid-answer is an invalid action.
_CJK_RE = re.compile(
    "[\u2e80-\u2fdf\u3000-\u33ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
    "\U00020000-\U0003134f]")
_TASK_PREFIX_RE = re.compile(r"^(task description:\s*)?your task is to\s+", re.IGNORECASE)
_SPACES_RE = re.compile(r"\s+")


def contains_cjk(text: str) -> bool:
  return _CJK_RE.search(text) is not None


def parse_action(response: str, require_think: bool = True) -> ParsedAction:
  """Turns a model response into the action sent to the environment.

  Lower-cases the response and takes the text between the first `<action>` and the first `</action>` after
  it. Invalid when the action tags are missing, nested, or enclose nothing; when `<think>`/`</think>` are
  missing or out of order (if `require_think`); or when the response contains CJK characters. An invalid
  response whose action tags parsed still sends that action (the think/CJK checks only mark it invalid);
  otherwise the env gets the last INVALID_TAIL_CHARS characters of the response.
  """
  text = response.lower()
  tail = text[-INVALID_TAIL_CHARS:]
  start = text.find("<action>")
  end = text.find("</action>", start + len("<action>")) if start >= 0 else -1
  if start < 0 or end < 0:
    return ParsedAction(tail, False, "no_action_tags")
  action = text[start + len("<action>"):end].strip()
  if "<action>" in action:
    return ParsedAction(tail, False, "nested_tags")
  if not action:
    return ParsedAction(tail, False, "empty")
  if require_think:
    think_open, think_close = text.find("<think>"), text.find("</think>")
    if think_open < 0 or think_close < think_open:
      return ParsedAction(action, False, "no_think_tags")
  if contains_cjk(text):
    return ParsedAction(action, False, "cjk")
  return ParsedAction(action, True)


def one_line(text: str) -> str:
  return _SPACES_RE.sub(" ", text).strip()


def task_line(task_description: str) -> str:
  """`Your task: <description on one line>` (a leading "Your task is to" is folded into the prefix)."""
  desc = _TASK_PREFIX_RE.sub("", one_line(task_description))
  return f"{TASK_LINE_PREFIX} {desc}"


def turn_line(require_think: bool) -> str:
  if require_think:
    return (f"{TURN_LINE_PREFIX}: reason briefly inside <think></think>, then give exactly one action "
            "inside <action></action>.")
  return f"{TURN_LINE_PREFIX}: give exactly one action inside <action></action> (you may think first "\
         "inside <think></think>)."


def _clip(text: str, max_chars: int) -> str:
  text = text.strip()
  if max_chars <= 0 or len(text) <= max_chars:
    return text
  return text[:max_chars].rstrip() + " ..."


def render_step_prompt(*, intro: str, task_description: str, history: Sequence[tuple[str, str]],
                       observation: str, choices: Sequence[str], history_length: int, require_think: bool,
                       history_obs_chars: int = 0) -> str:
  """The user message for one step.

  `history` is the whole episode so far as (observation, action) pairs; only the last `history_length`
  are shown (with their absolute step numbers), each past observation clipped to `history_obs_chars`
  characters (0 = no limit). `choices` are ready-made lines that describe the admissible actions.
  """
  if history_length < 0:
    raise ValueError(f"history_length must be >= 0, got {history_length}")
  window = list(history)[max(0, len(history) - history_length):] if history_length else []
  first = len(history) - len(window) + 1
  lines = [intro, task_line(task_description)]
  if window:
    lines.append(f"Your last {len(window)} of {len(history)} steps:")
    for k, (obs, act) in enumerate(window, start=first):
      lines.append(f"Step {k} observation: {_clip(obs, history_obs_chars)}")
      lines.append(f"Step {k} action: {act}")
  lines.append(f"Step {len(history) + 1} observation (now):")
  lines.append(observation.strip())
  lines.extend(choices)
  lines.append(turn_line(require_think))
  return "\n".join(lines)
