"""Prompt rendering and action parsing shared by the text environments.

Every step is a single-turn prompt (docs/algorithm.md §1): the env's step template (seed_jax/templates/<env>/)
filled with the task, a window of the last `history_length` (observation, action) pairs, the current
observation, the admissible actions and the answer-format line. The model answers
`<think>...</think><action>...</action>` (or another tag set, e.g. Search-QA's `<search>`/`<answer>`).
Environments with a fixed action vocabulary map the parsed text onto it with `restrict`.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

from seed_jax import templates
from seed_jax.envs.base import TURN_LINE_PREFIX, ParsedAction

# An unparsable response is still sent to the environment as its last characters, so the episode goes on
# and the env answers with its usual "unknown action" text.
INVALID_TAIL_CHARS = 30
# The answer tag of most environments; Search-QA answers with <search> or <answer> instead.
ACTION_TAGS = ("action",)
# Stands in a rendered prompt for the {skill} placeholder (a private-use character no observation holds).
SKILL_SLOT = "\ue000"

# CJK radicals and punctuation, kana, bopomofo, hangul, unified ideographs (+ ext. A, compatibility, ext. B-G)
# and full-width forms: a small model drifting into Chinese/Japanese/Korean mid-answer is an invalid action.
_CJK_RE = re.compile(
    "[\u2e80-\u2fdf\u3000-\u33ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
    "\U00020000-\U0003134f]")
_TASK_PREFIX_RE = re.compile(r"^(task description:\s*)?your task is to\s+", re.IGNORECASE)
_SPACES_RE = re.compile(r"\s+")


def contains_cjk(text: str) -> bool:
  return _CJK_RE.search(text) is not None


def parse_action(response: str, require_think: bool = True, tags: Sequence[str] = ACTION_TAGS) -> ParsedAction:
  """Turns a model response into the action sent to the environment.

  Lower-cases the response and takes the earliest complete `<tag>...</tag>` block of any tag in `tags` (the
  first `<tag>` and the first `</tag>` after it). With one tag the action is the block's content; with several
  it is the block in canonical form `<tag>content</tag>`, so the environment knows which kind it got. Invalid
  when no block is complete, when the content opens another block or is empty; when `<think>`/`</think>` are
  missing or out of order (if `require_think`); or when the response contains CJK characters. An invalid
  response whose block parsed still sends that action (the think/CJK checks only mark it invalid); otherwise
  the env gets the last INVALID_TAIL_CHARS characters of the response.
  """
  if not tags:
    raise ValueError("parse_action needs at least one answer tag, got tags=()")
  text = response.lower()
  tail = text[-INVALID_TAIL_CHARS:]
  blocks = []  # (start of the opening tag, tag, content) of each tag's first complete block
  for tag in tags:
    start = text.find(f"<{tag}>")
    end = text.find(f"</{tag}>", start + len(tag) + 2) if start >= 0 else -1
    if start >= 0 and end >= 0:
      blocks.append((start, tag, text[start + len(tag) + 2:end]))
  if not blocks:
    return ParsedAction(tail, False, "no_action_tags")
  _, tag, content = min(blocks)
  content = content.strip()
  if any(f"<{t}>" in content for t in tags):
    return ParsedAction(tail, False, "nested_tags")
  if not content:
    return ParsedAction(tail, False, "empty")
  action = content if len(tags) == 1 else f"<{tag}>{content}</{tag}>"
  if require_think:
    think_open, think_close = text.find("<think>"), text.find("</think>")
    if think_open < 0 or think_close < think_open:
      return ParsedAction(action, False, "no_think_tags")
  if contains_cjk(text):
    return ParsedAction(action, False, "cjk")
  return ParsedAction(action, True)


# Reasons of a response from which no action could be read (the env then gets the response's tail).
UNPARSED_REASONS = ("no_action_tags", "nested_tags", "empty")


def restrict(parsed: ParsedAction, canonical: Callable[[str], str | None]) -> ParsedAction:
  """Maps a parsed action onto an environment's fixed vocabulary: `canonical(action)` is the vocabulary entry
  it names, or None. An action outside the vocabulary is invalid ("not_admissible") and is sent as it is; a
  response whose tags did not parse is returned unchanged."""
  if parsed.reason in UNPARSED_REASONS:
    return parsed
  word = canonical(parsed.action)
  if word is None:
    return ParsedAction(parsed.action, False, "not_admissible")
  return ParsedAction(word, parsed.valid, parsed.reason)


def one_line(text: str) -> str:
  return _SPACES_RE.sub(" ", text).strip()


def task_text(task_description: str) -> str:
  """The description on one line, a leading "Your task is to" dropped: the {task_description} of a step prompt."""
  return _TASK_PREFIX_RE.sub("", one_line(task_description))


def _tag_pairs(tags: Sequence[str]) -> str:
  return " or ".join(f"<{t}></{t}>" for t in tags)


def turn_line(require_think: bool, tags: Sequence[str] = ACTION_TAGS) -> str:
  if require_think:
    return (f"{TURN_LINE_PREFIX}: reason briefly inside <think></think>, then give exactly one action "
            f"inside {_tag_pairs(tags)}.")
  return f"{TURN_LINE_PREFIX}: give exactly one action inside {_tag_pairs(tags)} (you may think first "\
         "inside <think></think>)."


def _clip(text: str, max_chars: int) -> str:
  text = text.strip()
  if max_chars <= 0 or len(text) <= max_chars:
    return text
  return text[:max_chars].rstrip() + " ..."


def render_step_prompt(env: str, *, task_description: str, history: Sequence[tuple[str, str]], observation: str,
                       admissible_actions: Sequence[str] = (), history_length: int, require_think: bool,
                       history_obs_chars: int = 0, tags: Sequence[str] = ACTION_TAGS, list_format: str = "comma",
                       turn: str = "", **extra: str) -> str:
  """The user message for one step: `env`'s step template (templates.KINDS lists its placeholders).

  `history` is the whole episode so far as (observation, action) pairs (shown so, or each action with its
  result as config.templates.history_pairs says); only the last `history_length` are shown (with their
  absolute step numbers), each past observation clipped to `history_obs_chars` characters (0 = no limit); with
  none shown the first-step template is used. `admissible_actions` are joined as config.templates.action_list
  says (else as `list_format`, the env's own); `tags` are the answer tags the turn line asks for (as
  `parse_action` reads them); `turn` replaces that line (an env answering in another form);
  `extra` fills the env's own placeholders (templates.ENV_FIELDS).
  """
  if history_length < 0:
    raise ValueError(f"history_length must be >= 0, got {history_length}")
  if templates.active().history_pairs == "result":  # each action with the observation that followed it
    history = [(after, act) for (_, act), after in zip(history, [o for o, _ in history[1:]] + [observation])]
  window = list(history)[max(0, len(history) - history_length):] if history_length else []
  first = len(history) - len(window) + 1
  pair = templates.get("step_history")
  past = [pair.render({"step": k, "observation": _clip(obs, history_obs_chars), "action": act})
          for k, (obs, act) in enumerate(window, start=first)]
  # With placement "placeholder" the slot marks where H(h, s) puts the skill; fit_prompt takes it out.
  skill = SKILL_SLOT if templates.active().skill_placement == "placeholder" else ""
  actions = templates.join_actions(admissible_actions, list_format)
  fields = dict(task_description=task_text(task_description), step_count=len(history), history_length=len(window),
                action_history="\n".join(past), current_step=len(history) + 1,
                current_observation=observation.strip(), admissible_actions=actions, available_actions=actions,
                turn_line=turn or turn_line(require_think, tags), skill=skill, **extra)
  return templates.get("step_later" if window else "step_first", env).render(fields)


def split_skill_slot(prompt: str) -> tuple[str, int | None]:
  """(the prompt without its skill slot, the slot's offset or None): H(h, s) puts the skill block there."""
  at = prompt.find(SKILL_SLOT)
  return (prompt, None) if at < 0 else (prompt.replace(SKILL_SLOT, ""), at)


def parse_env_action(response: str, cfg) -> ParsedAction:
  """`parse_action` with the env config's think rule: the text environments' parse_action."""
  return parse_action(response, cfg.require_think)


def render_env_prompt(env: str, task_description: str, history: Sequence[tuple[str, str]], observation: str,
                      admissible_actions: Sequence[str], cfg, tags: Sequence[str] = ACTION_TAGS,
                      list_format: str = "comma", turn: str = "", **extra: str) -> str:
  """`render_step_prompt` with the env config's history window, think rule and history clipping."""
  return render_step_prompt(env, task_description=task_description, history=history, observation=observation,
                            admissible_actions=admissible_actions, history_length=cfg.history_length,
                            require_think=cfg.require_think, history_obs_chars=cfg.history_obs_chars, tags=tags,
                            list_format=list_format, turn=turn, **extra)
