"""The skill contract: analysis prompt, JSON parsing, H(h, s), and analyze_trajectories over a stub backend."""
import math

import pytest
from skills_helpers import toy_trajectory

from configs import base
from seed_jax import skills


# ---------------------------------------------------------------------------------------------------------
# parse_skill

OBJ = '{"episode_summary": "went to the kitchen", "episode_skill": "Open the fridge first."}'

PARSE_CASES = [
    ("plain", OBJ, "Open the fridge first.", "went to the kitchen"),
    ("fenced", "Sure.\n```json\n" + OBJ + "\n```\nDone.", "Open the fridge first.", "went to the kitchen"),
    ("fenced_no_lang", "```\n" + OBJ + "\n```", "Open the fridge first.", "went to the kitchen"),
    ("prose_around", "Here's my analysis: " + OBJ + " Hope it's useful!", "Open the fridge first.",
     "went to the kitchen"),
    ("second_has_skill", 'Draft: {"episode_summary": "x"} Final: {"episode_summary": "y", "episode_skill": "Do B."}',
     "Do B.", "y"),
    ("trailing_commas", '{"episode_summary": "s", "episode_skill": "Use [a, b],",}', "Use [a, b],", "s"),
    ("python_literal", "{'episode_summary': None, 'episode_skill': 'Check the stove.', 'confident': True}",
     "Check the stove.", None),
    ("braces_in_strings", '{"episode_summary": "saw {a} and \\"}\\"", "episode_skill": "If {x} appears, stop."}',
     "If {x} appears, stop.", 'saw {a} and "}"'),
    ("nested_object", 'text {"meta": {"k": 1}, "episode_summary": "s", "episode_skill": "Go north."} end',
     "Go north.", "s"),
    ("list_skill", '{"episode_summary": "s", "episode_skill": ["Go north.", "Take key."]}',
     "Go north.\nTake key.", "s"),
    ("whitespace_stripped", '{"episode_summary": " s ", "episode_skill": "  Go.\\n"}', "Go.", "s"),
]


@pytest.mark.parametrize("name,reply,skill,summary", PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_parse_ok(name, reply, skill, summary):
  p = skills.parse_skill(reply)
  assert (p.ok, p.skill, p.summary, p.error) == (True, skill, summary, "")


FAIL_CASES = [
    ("empty_reply", "", "empty reply"),
    ("blank_reply", "  \n ", "empty reply"),
    ("garbage", "I cannot do that {not json at all", "no JSON object found"),
    ("empty_skill", '{"episode_summary": "s", "episode_skill": ""}', "no object with a non-empty string"),
    ("no_skill_field", '{"episode_summary": "s"}', "no object with a non-empty string"),
    ("skill_not_string", '{"episode_summary": "s", "episode_skill": 3}', "no object with a non-empty string"),
    ("truncated", '{"episode_summary": "s", "episode_skill": "Go nor', "no JSON object found"),
    ("array_only", '["episode_skill", "x"]', "no JSON object found"),
]


@pytest.mark.parametrize("name,reply,error", FAIL_CASES, ids=[c[0] for c in FAIL_CASES])
def test_parse_fails_with_reason(name, reply, error):
  p = skills.parse_skill(reply)
  assert (p.ok, p.skill) == (False, None)
  assert p.error.startswith(error)


SALVAGE_CASES = [
    ("cut_mid_skill", '{"episode_summary": "went east", "episode_skill": "Go nor', "Go nor", "went east"),
    ("cut_after_skill", '{"episode_summary": "s", "episode_skill": "Take the coin."', "Take the coin.", "s"),
    ("cut_in_escape", '{"episode_skill": "Say \\"hi\\" then \\u00e9 and \\u00', 'Say "hi" then \u00e9 and', None),
    ("cut_dangling_backslash", '```json\n{"episode_skill": "Line one.\\nLine \\', "Line one.\nLine", None),
    ("cut_mid_summary_skill_first", '{"episode_skill": "Go west.", "episode_summary": "it we', "Go west.", "it we"),
]


@pytest.mark.parametrize("name,reply,skill,summary", SALVAGE_CASES, ids=[c[0] for c in SALVAGE_CASES])
def test_salvage_reads_a_cut_off_skill(name, reply, skill, summary):
  assert skills.parse_skill(reply).ok is False  # strict parsing (the reference's) drops these replies
  p = skills.parse_skill(reply, salvage=True)
  assert (p.ok, p.salvaged, p.skill, p.summary) == (True, True, skill, summary)


@pytest.mark.parametrize("reply", ['{"episode_summary": "the agent went nor', '{"episode_skill": "', "no json",
                                   '{"episode_skill": 3', '{"episode_summary": "s", "episode_skill": ""}'])
def test_salvage_needs_a_non_empty_skill_string(reply):
  p = skills.parse_skill(reply, salvage=True)
  assert (p.ok, p.skill, p.salvaged) == (False, None, False)


def test_salvage_leaves_complete_replies_alone():
  p = skills.parse_skill(OBJ, salvage=True)
  assert (p.ok, p.salvaged, p.skill) == (True, False, "Open the fridge first.")


def test_salvaged_rate_counts_cut_replies():
  cfg = base.get_base().analyzer
  cut = '{"episode_summary": "s", "episode_skill": "Go nor'
  trajs = [toy_trajectory(1, 0.0)]
  assert skills.analyze_trajectories(_Replies(cut), trajs, cfg).parse_rate == 0.0  # off by default (reference)
  cfg.salvage_truncated = True
  res = skills.analyze_trajectories(_Replies(cut), trajs, cfg)
  assert (res.parse_rate, res.salvaged_rate, res.skills) == (1.0, 1.0, ["Go nor"])


def test_parse_never_raises_on_odd_input():
  for reply in [None, "{" * 5000, "}" * 10 + "{" * 10, "{'a': [1, 2" * 200, "```", "```json\n{\n", "{'a': 1e999999}",
                '{"a":' * 5000 + "1" + "}" * 5000]:
    assert skills.parse_skill(reply).ok is False
    skills.parse_skill(reply, salvage=True)


def test_format_skill_json_round_trips():
  text = skills.format_skill_json("sum \"q\"", "rule {x}")
  p = skills.parse_skill(text)
  assert (p.ok, p.summary, p.skill) == (True, 'sum "q"', "rule {x}")


# ---------------------------------------------------------------------------------------------------------
# augment_prompt

def test_augment_after_task_line():
  prompt = "Intro.\nYour task: boil water\nHistory: none\nNow it is your turn to act."
  assert skills.augment_prompt(prompt, " Heat the pot first. ") == (
      "Intro.\nYour task: boil water\nSkill from experience: Heat the pot first.\nHistory: none\n"
      "Now it is your turn to act.")


def test_augment_task_line_last_without_newline():
  assert skills.augment_prompt("A\nYour task: x", "S.") == "A\nYour task: x\nSkill from experience: S.\n"


def test_augment_before_turn_line():
  prompt = "Observation: dark room\nNow it is your turn to act.\n"
  assert skills.augment_prompt(prompt, "Turn on the light.") == (
      "Observation: dark room\nSkill from experience: Turn on the light.\nNow it is your turn to act.\n")


def test_augment_appends():
  assert skills.augment_prompt("Observation: x", "S.") == "Observation: x\nSkill from experience: S."
  assert skills.augment_prompt("Observation: x\n", "S.") == "Observation: x\nSkill from experience: S."
  assert skills.augment_prompt("", "S.") == "Skill from experience: S."


def test_augment_empty_skill_is_identity():
  prompt = "Your task: x\nNow it is your turn"
  for skill in (None, "", "  \n"):
    assert skills.augment_prompt(prompt, skill) is prompt


# ---------------------------------------------------------------------------------------------------------
# analysis prompt

def test_analysis_prompt_success_and_failure():
  ok = skills.analysis_prompt(toy_trajectory(2, 10.0, invalid_at=(2,)))
  assert "SUCCEEDED" in ok and "workflow" in ok and "avoidance" not in ok
  assert "Task: boil water\nOutcome: success (return 10, 2 steps, ended by done)\n" in ok
  assert ("\nStep 1\nObservation:\nobs 1\nResponse:\n<think>t1</think><action>act 1</action>\n"
          "Action valid: true\n") in ok
  assert ("\nStep 2\nObservation:\nobs 2\nResponse:\n<think>t2</think><action>act 2</action>\n"
          "Action valid: false\n") in ok
  assert '{"episode_summary": "<what happened>", "episode_skill": "<the rule>"}' in ok
  assert ok.index("Step 1") < ok.index("Step 2") < ok.index("# Answer")

  bad = skills.analysis_prompt(toy_trajectory(1, 0.0))
  assert "FAILED" in bad and "avoidance" in bad and "warning signs" in bad and "workflow" not in bad
  assert "Outcome: failure (return 0, 1 steps, ended by max_steps)" in bad
  # success means return >= threshold, independent of traj.success
  assert "Outcome: success" in skills.analysis_prompt(toy_trajectory(1, 0.5), success_threshold=0.5)


GOLDEN_FAILURE_PROMPT = """\
You are reviewing one episode of an agent acting in a text environment.
The agent FAILED. Distill avoidance rules: the core mistake that prevented success and the warning signs that \
show the mistake is happening, so it can be recognised and avoided next time.
Write `episode_skill` as a short rule addressed to the agent (imperative, at most a few sentences) that it can \
apply in a new attempt, not as a story of what happened. Write `episode_summary` as one or two sentences on what \
happened.
Answer with JSON only, exactly this object and nothing else:
{"episode_summary": "<what happened>", "episode_skill": "<the rule>"}

# Episode
Task: boil water
Outcome: failure (return 0, 1 steps, ended by max_steps)

Step 1
Observation:
obs 1
Response:
<think>t1</think><action>act 1</action>
Action valid: true

# Answer
Reply with the JSON object with `episode_summary` and `episode_skill` only."""


def test_analysis_prompt_golden():
  """The prompt is a contract with SFT data and checkpoints: any change to it must be deliberate."""
  assert skills.analysis_prompt(toy_trajectory(1, 0.0)) == GOLDEN_FAILURE_PROMPT


def test_fitted_drops_oldest_steps_and_keeps_schema():
  traj = toy_trajectory(10, 0.0)
  header, blocks, footer = skills.analysis_parts(traj)
  calls = []
  count = lambda s: calls.append(1) or len(s)  # one token per character

  assert skills.analysis_prompt_fitted(traj, count, 10**6) == skills.analysis_prompt(traj)

  keep3 = "\n\n".join([header, "[7 earlier steps omitted]", *blocks[7:], footer])
  calls.clear()
  assert skills.analysis_prompt_fitted(traj, count, len(keep3)) == keep3
  assert len(calls) <= 1 + math.ceil(math.log2(10))
  keep2 = "\n\n".join([header, "[8 earlier steps omitted]", *blocks[8:], footer])
  assert skills.analysis_prompt_fitted(traj, count, len(keep3) - 1) == keep2

  tiny = skills.analysis_prompt_fitted(traj, count, 5)
  assert tiny == "\n\n".join([header, "[10 earlier steps omitted]", footer])
  assert "Step" not in tiny.split("# Episode")[1].split("# Answer")[0].replace("steps", "")
  assert '"episode_skill": "<the rule>"' in tiny and "Reply with the JSON object" in tiny


# ---------------------------------------------------------------------------------------------------------
# analyze_trajectories


class _Replies:
  """A backend that answers every prompt with the same reply."""

  def __init__(self, reply: str):
    self.reply = reply

  def analyze(self, prompts):
    return [self.reply] * len(prompts)


def test_max_skill_chars():
  cfg = base.get_base().analyzer
  cfg.max_skill_chars = 5
  res = skills.analyze_trajectories(_Replies(skills.format_skill_json("s", "abcdefgh")), [toy_trajectory(1, 0.0)], cfg)
  assert res.skills == ["abcde"] and res.replies == [skills.format_skill_json("s", "abcdefgh")]
