"""Hindsight skills: the analysis prompt, robust JSON parsing, the skill-augmented prompt H(h, s), and
`analyze_trajectories` (prompts in, parsed skills out) over any backend of analyzers.py.

The prompts are template files (seed_jax/templates/, selected by config.templates). The analysis prompt and its
JSON schema (`episode_summary`, `episode_skill`) are a contract: SFT records and checkpoints depend on them, so
change them only together with a new SFT run; the keys are fixed.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import re
from typing import Any, Callable, Protocol, Sequence

import ml_collections

from seed_jax import templates
from seed_jax.envs.base import TASK_LINE_PREFIX, TURN_LINE_PREFIX, Trajectory
from seed_jax.templates import SKILL_FIELD, SUMMARY_FIELD
SKILL_BLOCK_PREFIX = "Skill from experience: "  # how the default skill block starts


# ----------------------------------------------------------------------------------------------------------
# Analysis prompt


def is_success(traj: Trajectory, threshold: float = 1.0) -> bool:
  return traj.episode_return >= threshold


def analysis_parts(traj: Trajectory, success_threshold: float = 1.0) -> tuple[str, list[str], str]:
  """(header, one block per step, footer), each from its template; `_join` sets them off by
  config.templates.analysis_separator. The header holds the instruction, schema, task and outcome; the footer
  repeats the answer format, so left truncation only ever removes step blocks."""
  opts = templates.active()
  success = is_success(traj, success_threshold)
  header = templates.get("analysis_success" if success else "analysis_failure").render(dict(
      task_description=traj.task_description or opts.empty_task, outcome="success" if success else "failure",
      success="true" if success else "false", episode_return=traj.episode_return, step_count=traj.length,
      termination=traj.termination))
  step = templates.get("analysis_step")
  blocks = [step.render(dict(step=k, observation=s.observation, response=s.response_text, action=s.action,
                             action_valid="true" if s.action_valid else "false"))
            for k, s in enumerate(traj.steps, opts.analysis_first_step)]
  return header, blocks, templates.get("analysis_footer").render({})


def _join(header: str, blocks: Sequence[str], omitted: int, footer: str) -> str:
  gap = [templates.get("analysis_omitted").render({"omitted": omitted})] if omitted else []
  return templates.active().analysis_separator.join([header, *gap, *blocks, footer])


def analysis_prompt(traj: Trajectory, success_threshold: float = 1.0) -> str:
  header, blocks, footer = analysis_parts(traj, success_threshold)
  return _join(header, blocks, 0, footer)


def analysis_prompt_fitted(traj: Trajectory, count_tokens: Callable[[str], int], max_tokens: int,
                           success_threshold: float = 1.0) -> str:
  """The analysis prompt with the oldest step blocks dropped until it has at most `max_tokens` tokens.

  `count_tokens` should count the prompt as the model will see it (chat template included). Binary search over
  the number of kept (newest) blocks: O(log steps) calls. The header and footer always survive, even when no
  step fits."""
  header, blocks, footer = analysis_parts(traj, success_threshold)
  n = len(blocks)
  make = lambda keep: _join(header, blocks[n - keep:] if keep else [], n - keep, footer)
  full = make(n)
  if count_tokens(full) <= max_tokens:
    return full
  lo, hi = 0, n - 1  # the largest keep in [lo, hi] that fits; keep=0 is returned even if it does not fit
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if count_tokens(make(mid)) <= max_tokens:
      lo = mid
    else:
      hi = mid - 1
  return make(lo)


# ----------------------------------------------------------------------------------------------------------
# Parsing


@dataclasses.dataclass
class SkillParse:
  skill: str | None
  summary: str | None
  ok: bool
  error: str = ""
  salvaged: bool = False  # read from a reply whose JSON object was cut off (salvage_truncated)


def format_skill_json(summary: str, skill: str) -> str:
  """The canonical reply (SFT target) for one analysis."""
  return json.dumps({SUMMARY_FIELD: summary, SKILL_FIELD: skill}, ensure_ascii=False)


def _fenced_blocks(text: str) -> list[str]:
  out, pos = [], 0
  while (start := text.find("```", pos)) >= 0:
    body = text.find("\n", start)
    end = text.find("```", start + 3)
    if end < 0:
      break
    if body < 0 or body > end:  # ``` {...} ``` on one line
      body = start + 2
    out.append(text[body + 1:end])
    pos = end + 3
  return out


def _brace_spans(text: str) -> list[str]:
  """Every balanced {...} substring, outermost first within each position; quotes are tracked inside braces
  only, so apostrophes in surrounding prose do not confuse the scan."""
  spans, stack, quote, i = [], [], "", 0
  while i < len(text):
    ch = text[i]
    if quote:
      if ch == "\\":
        i += 1
      elif ch == quote:
        quote = ""
    elif ch in "\"'" and stack:
      quote = ch
    elif ch == "{":
      stack.append(i)
    elif ch == "}" and stack:
      spans.append((stack.pop(), i + 1))
    i += 1
  return [text[a:b] for a, b in sorted(spans)]


def _strip_trailing_commas(text: str) -> str:
  out, quote, i = [], "", 0
  while i < len(text):
    ch = text[i]
    if quote:
      if ch == "\\" and i + 1 < len(text):
        out.append(text[i:i + 2])
        i += 2
        continue
      if ch == quote:
        quote = ""
    elif ch in "\"'":
      quote = ch
    elif ch == ",":
      j = i + 1
      while j < len(text) and text[j].isspace():
        j += 1
      if j < len(text) and text[j] in "}]":
        i += 1
        continue
    out.append(ch)
    i += 1
  return "".join(out)


def _decode(candidate: str) -> dict | None:
  candidate = candidate.strip()
  if not candidate.startswith("{"):
    return None
  for text in (candidate, _strip_trailing_commas(candidate)):
    try:
      value = json.loads(text)
    except (ValueError, RecursionError):
      try:  # single quotes, True/None, ...
        value = ast.literal_eval(text)
      except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        continue
    if isinstance(value, dict):
      return value
  return None


def _text_field(value: Any) -> str | None:
  if isinstance(value, str):
    return value.strip()
  if isinstance(value, list) and value and all(isinstance(v, str) for v in value):  # a list of rules
    return "\n".join(v.strip() for v in value).strip()
  return None


def _cut_string_field(text: str, key: str) -> str | None:
  """The value of `"key": "...` in a JSON text that may end inside that string: up to its closing quote, or
  to the end of the text (a dangling escape dropped). None when the key or its string value is absent."""
  m = re.search(r'"' + re.escape(key) + r'"\s*:\s*"', text)
  if m is None:
    return None
  body, i = [], m.end()
  while i < len(text) and text[i] != '"':
    step = 2 if text[i] == "\\" else 1
    body.append(text[i:i + step])
    i += step
  raw = "".join(body)
  for end in range(len(raw), max(len(raw) - 6, -1), -1):  # a cut \uXXXX or \ escape: drop its start
    try:
      return json.loads('"' + raw[:end] + '"').strip()
    except ValueError:
      continue
  return None


def salvage_skill(reply: str) -> SkillParse:
  """The skill (and summary) of a reply whose JSON object was cut off by the token limit, e.g.
  `{"episode_summary": "...", "episode_skill": "Go east, then` -> "Go east, then". Fails without a non-empty
  `episode_skill` string."""
  skill = _cut_string_field(reply, SKILL_FIELD) if isinstance(reply, str) else None
  if not skill:
    return SkillParse(None, None, False, f"no {SKILL_FIELD!r} string to salvage")
  return SkillParse(skill, _cut_string_field(reply, SUMMARY_FIELD), True, salvaged=True)


def parse_skill(reply: str, max_candidates: int = 64, salvage: bool = False) -> SkillParse:
  """Finds the analysis object in a model reply. Never raises.

  Candidates in order: fenced blocks, the whole reply, then every balanced {...} span. The first decoded object
  with a non-empty `episode_skill` wins; otherwise, with `salvage`, the text of a cut-off `episode_skill` string
  (salvage_skill); otherwise the reply fails with a reason."""
  parsed = _parse_complete(reply, max_candidates)
  if parsed.ok or not salvage:
    return parsed
  rescued = salvage_skill(reply)
  return rescued if rescued.ok else parsed


def _parse_complete(reply: str, max_candidates: int) -> SkillParse:
  if not isinstance(reply, str) or not reply.strip():
    return SkillParse(None, None, False, "empty reply")
  candidates = _fenced_blocks(reply) + [reply] + _brace_spans(reply)
  seen, decoded = set(), 0
  for cand in candidates:
    cand = cand.strip()
    if cand in seen:
      continue
    seen.add(cand)
    if len(seen) > max_candidates:
      break
    obj = _decode(cand)
    if obj is None:
      continue
    decoded += 1
    skill = _text_field(obj.get(SKILL_FIELD))
    if skill:
      return SkillParse(skill, _text_field(obj.get(SUMMARY_FIELD)), True)
  if decoded:
    return SkillParse(None, None, False, f"no object with a non-empty string {SKILL_FIELD!r} ({decoded} decoded)")
  return SkillParse(None, None, False, "no JSON object found")


# ----------------------------------------------------------------------------------------------------------
# H(h, s)


def augment_prompt(prompt_text: str, skill: str | None, skill_at: int | None = None) -> str:
  """Inserts the skill block (its template and a line break) as config.templates.skill_placement says:
  "after_task": after the task line, else before the turn line, else at the end; "before_turn": before the turn
  line, else at the end; "placeholder": at offset `skill_at`, where the step template's {skill} stood
  (rollout.fit_prompt records it)."""
  if not skill or not skill.strip():
    return prompt_text
  augmented = _augment(prompt_text, skill, skill_at)
  return augmented.strip() if templates.active().strip_teacher else augmented


def _augment(prompt_text: str, skill: str, skill_at: int | None) -> str:
  block = templates.get("skill_block").render({"skill": skill.strip()}) + "\n"
  placement = templates.active().skill_placement
  if placement == "placeholder":
    if skill_at is None:
      raise ValueError("skill_placement 'placeholder' needs the prompt's {skill} offset (Step.info['skill_at']); "
                       "this prompt was rendered without one")
    return prompt_text[:skill_at] + block + prompt_text[skill_at:]
  lines = prompt_text.splitlines(keepends=True)
  for i, line in enumerate(lines):
    if placement == "after_task" and line.lstrip().startswith(TASK_LINE_PREFIX):
      head = "".join(lines[:i + 1])
      head += "" if head.endswith("\n") else "\n"
      return head + block + "".join(lines[i + 1:])
  for i, line in enumerate(lines):
    if line.lstrip().startswith(TURN_LINE_PREFIX):
      return "".join(lines[:i]) + block + "".join(lines[i:])
  if not prompt_text:
    return block.rstrip("\n")
  return prompt_text + ("" if prompt_text.endswith("\n") else "\n") + block.rstrip("\n")


# ----------------------------------------------------------------------------------------------------------
# A batch of trajectories through one backend


class Analyzer(Protocol):
  """A backend of seed_jax.analyzers."""
  def analyze(self, prompts: list[str]) -> list[str]:
    """Raw replies, one per prompt ("" when a reply could not be obtained)."""
    ...


@dataclasses.dataclass
class Analysis:
  parses: list[SkillParse]  # one per trajectory, in order
  prompts: list[str]
  replies: list[str]

  @property
  def parse_rate(self) -> float:
    return sum(p.ok for p in self.parses) / len(self.parses) if self.parses else 0.0

  @property
  def salvaged_rate(self) -> float:
    return sum(p.salvaged for p in self.parses) / len(self.parses) if self.parses else 0.0

  @property
  def skills(self) -> list[str | None]:
    return [p.skill if p.ok else None for p in self.parses]


def analyze_trajectories(analyzer: Analyzer, trajs: Sequence[Trajectory], cfg: ml_collections.ConfigDict,
                         count_tokens: Callable[[str], int] | None = None) -> Analysis:
  """Builds one analysis prompt per trajectory (fitted to cfg.max_prompt_tokens when `count_tokens` is given),
  runs the backend once on the whole batch and parses every reply."""
  if count_tokens is None:
    prompts = [analysis_prompt(t, cfg.success_threshold) for t in trajs]
  else:
    prompts = [analysis_prompt_fitted(t, count_tokens, cfg.max_prompt_tokens, cfg.success_threshold)
               for t in trajs]
  replies = analyzer.analyze(prompts)  # also with none: the policy backend's decode is collective
  if len(replies) != len(prompts):
    raise ValueError(f"analyzer returned {len(replies)} replies for {len(prompts)} prompts")
  parses = [parse_skill(r, salvage=cfg.salvage_truncated) for r in replies]
  if cfg.max_skill_chars:
    for p in parses:
      if p.skill and len(p.skill) > cfg.max_skill_chars:
        p.skill = p.skill[:cfg.max_skill_chars].rstrip()
  return Analysis(parses, prompts, replies)
