"""Prompt templates: every prompt the policy or the analyzer reads is a text file with str.format fields.

The files beside this module are the defaults (the step prompts per environment, in <env>/); config.templates
names a replacement file per template ("" = the default). A template's text is its file's, less one final
newline (editors add one). `check` (run by config.validate) loads every template of a run and rejects a missing
file, an unknown placeholder or a missing required one; `use` (run by the entry points) selects them for this
process.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pathlib
import string
from typing import Any, Mapping, Sequence

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
PLACEMENTS = ("after_task", "before_turn", "placeholder")  # config.templates.skill_placement
# config.templates.action_list: how {admissible_actions} / {available_actions} join the env's actions ("" = the
# env's own: "lines" for WebShop, "comma" elsewhere). verl-agent lists ALFWorld's as "quoted_lines" and
# WebShop's as "quoted_commas".
ACTION_LISTS = {
    "comma": lambda acts: ", ".join(acts),
    "lines": lambda acts: "\n".join(acts),
    "quoted_lines": lambda acts: "\n ".join(f"'{a}'" for a in acts),
    "quoted_commas": lambda acts: "\n".join(f"'{a}'," for a in acts),
}
# The analysis reply's fixed keys (seed_jax.skills parses them); every analysis template must name both.
SKILL_FIELD = "episode_skill"
SUMMARY_FIELD = "episode_summary"

_STEP = ("task_description", "step_count", "history_length", "action_history", "current_step", "current_observation",
         "admissible_actions", "available_actions", "turn_line", "skill")
_HEADER = ("task_description", "outcome", "success", "episode_return", "step_count", "termination")
ENV_FIELDS = {"sciworld": ("objects",), "sokoban": ("legend",)}  # step placeholders only one environment fills
# A line holding only one of these is left out when its value is empty, so an empty list (or Sokoban's legend of
# the text grid, in an image prompt) leaves no blank line.
_LIST_LINES = {"{" + f + "}": f for f in ("admissible_actions", "available_actions", "action_history", "legend")}
# Sample values for the start-up render; fields not listed are strings.
_SAMPLES = {"step_count": 1, "history_length": 1, "current_step": 2, "step": 1, "omitted": 1, "episode_return": 1.0}


@dataclasses.dataclass(frozen=True)
class Kind:
  fields: tuple[str, ...]  # the placeholders it may use
  required: tuple[str, ...] = ()  # the ones it must use
  per_env: bool = False  # the default is <env>/<kind>.txt


KINDS = {
    # The observation is optional: a template may show it only inside the history (verl-agent's Search prompt).
    "step_first": Kind(_STEP, per_env=True),  # no past step shown
    "step_later": Kind(_STEP, ("action_history",), per_env=True),
    "step_history": Kind(("step", "observation", "action"), ("action",)),  # one pair of {action_history}
    "analysis_success": Kind(_HEADER),
    "analysis_failure": Kind(_HEADER),
    "analysis_step": Kind(("step", "observation", "response", "action", "action_valid"), ("response",)),
    "analysis_omitted": Kind(("omitted",)),
    "analysis_footer": Kind(()),
    "skill_block": Kind(("skill",), ("skill",)),
    "json_retry": Kind(("error", "reply_tail")),  # why the reply did not parse, its last REPLY_TAIL_CHARS
}


class TemplateError(ValueError):
  pass


@dataclasses.dataclass(frozen=True)
class Template:
  path: str
  text: str
  fields: frozenset[str]

  def render(self, values: Mapping[str, Any]) -> str:
    lines = [line for line in self.text.split("\n")
             if not (line in _LIST_LINES and values.get(_LIST_LINES[line], "") == "")]
    return "\n".join(lines).format_map(values)


def _names(text: str) -> set[str]:
  """The placeholders of a format string, those nested in format specs ({x:{y}}) included."""
  out = set()
  for _, name, spec, _ in string.Formatter().parse(text):
    if name is not None:
      out |= {name} | _names(spec or "")
  return out


@functools.lru_cache(maxsize=None)
def load(path: str, kind: str, env: str = "") -> Template:
  """The template at `path` (read once per process), checked against the placeholders of `kind` (and of `env`,
  for step prompts)."""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except OSError as e:
    raise TemplateError(f"{path}: cannot read it ({e.strerror or e})") from None
  text = text[:-1] if text.endswith("\n") else text
  try:
    names = _names(text)
  except ValueError as e:
    raise TemplateError(f"{path}: {e} (a literal brace is written {{{{ or }}}})") from None
  spec = KINDS[kind]
  allowed = spec.fields + (ENV_FIELDS.get(env, ()) if spec.per_env else ())
  for name in sorted(names):
    if name not in allowed:
      listed = ", ".join("{" + f + "}" for f in allowed) or "none"
      raise TemplateError(f"{path}: unknown placeholder {{{name}}}; a {kind} template may use {listed}")
  for name in spec.required:
    if name not in names:
      raise TemplateError(f"{path}: the required placeholder {{{name}}} is missing")
  return Template(path, text, frozenset(names))


@dataclasses.dataclass(frozen=True)
class Selection:
  paths: Mapping[str, str]  # kind -> file; "" = the default
  skill_placement: str = "after_task"
  action_list: str = ""  # a key of ACTION_LISTS; "" = the env's own
  history_pairs: str = "before"  # {action_history}'s {observation}: the one an action answered, or its "result"
  analysis_first_step: int = 1  # the number of an episode's first step in the analysis prompt
  analysis_separator: str = "\n\n"  # between the analysis prompt's parts; "" = the template files own them
  empty_task: str = ""  # the analysis header's {task_description} when the task is empty
  strip_teacher: bool = False  # H(h, s) without leading and trailing whitespace

  @classmethod
  def from_config(cls, tcfg: Mapping[str, Any]) -> Selection:
    options = {f.name: tcfg[f.name] for f in dataclasses.fields(cls)[1:] if f.name in tcfg}
    return cls({k: tcfg.get(k, "") for k in KINDS}, **options)

  def path(self, kind: str, env: str = "") -> str:
    if self.paths[kind]:
      return self.paths[kind]
    return os.path.join(PACKAGE_DIR, env if KINDS[kind].per_env else "", f"{kind}.txt")


DEFAULT = Selection({k: "" for k in KINDS})
_active = DEFAULT


def use(tcfg: Mapping[str, Any] | None) -> None:
  """Renders this process's prompts with config.templates (None: the defaults)."""
  global _active
  _active = DEFAULT if tcfg is None else Selection.from_config(tcfg)


def get(kind: str, env: str = "") -> Template:
  return load(_active.path(kind, env), kind, env)


def active() -> Selection:
  """This process's selection: its rendering options (skill placement, action lists, the analysis prompt's
  numbering and separators, ...)."""
  return _active


def join_actions(actions: Sequence[str], env_default: str = "comma") -> str:
  """The env's actions as {admissible_actions} shows them: config.templates.action_list, else `env_default`."""
  return ACTION_LISTS[_active.action_list or env_default](list(actions))


def check(tcfg: Mapping[str, Any], env: str = "") -> None:
  """Loads and test-renders every template of a run in `env` ("" = none: step prompts are skipped unless set)."""
  sel = Selection.from_config(tcfg)
  loaded = {}
  for kind in KINDS:
    if KINDS[kind].per_env and not env and not sel.paths[kind]:
      continue
    try:
      tpl = loaded[kind] = load(sel.path(kind, env), kind, env)
      tpl.render({f: _SAMPLES.get(f, "x") for f in tpl.fields})  # format specs such as {step:d} fail here
    except (ValueError, TypeError) as e:  # TemplateError is a ValueError
      raise TemplateError(f"config.templates.{kind}: {e}") from None
  for kind in ("step_first", "step_later"):
    if kind not in loaded:
      continue
    uses_skill = "skill" in loaded[kind].fields
    if sel.skill_placement == "placeholder" and not uses_skill:
      raise TemplateError(f"config.templates.skill_placement='placeholder': {loaded[kind].path} has no {{skill}}")
    if sel.skill_placement != "placeholder" and uses_skill:
      raise TemplateError(f"config.templates.{kind}: {loaded[kind].path} uses {{skill}}, which only "
                          "config.templates.skill_placement='placeholder' fills")
  parts = {"analysis_success": ("analysis_success", "analysis_footer"),
           "analysis_failure": ("analysis_failure", "analysis_footer"), "json_retry": ("json_retry",)}
  for kind, names in parts.items():
    text = "".join(loaded[n].text for n in names)
    for key in (SUMMARY_FIELD, SKILL_FIELD):
      if key not in text:
        raise TemplateError(f"config.templates.{kind}: {key!r}, a key the reply is parsed for, appears nowhere in "
                            + " + ".join(loaded[n].path for n in names))


def fingerprint(tcfg: Mapping[str, Any]) -> dict[str, str]:
  """Hashes of the replaced templates' texts and a changed placement ({} for the defaults)."""
  sel = Selection.from_config(tcfg)
  out = {k: hashlib.sha256(pathlib.Path(p).read_bytes()).hexdigest()[:12] for k, p in sel.paths.items() if p}
  for f in dataclasses.fields(Selection)[1:]:  # changed options, by value
    if getattr(sel, f.name) != getattr(DEFAULT, f.name):
      out[f.name] = getattr(sel, f.name)
  return out
