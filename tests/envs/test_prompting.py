"""Action parsing (docs/algorithm.md §1) and the shared step-prompt layout."""
import pytest

from configs import sciworld as sw_config, textworld_express as twx_config
from seed_jax.envs import prompting
from seed_jax.envs.base import TASK_LINE_PREFIX, TURN_LINE_PREFIX, Observation, ParsedAction

LONG_NO_TAGS = "I think I should open the fridge and then take the milk out"

# (response, require_think, expected action sent to the env, valid, reason)
PARSE_TABLE = [
    ("<think>look first</think><action>Look Around</action>", True, "look around", True, ""),
    ("<think>x</think>\n<action>  open door to kitchen \n</action>", True, "open door to kitchen", True, ""),
    # the first <action>...</action> pair wins; later ones are ignored
    ("<think>x</think><action>go north</action><action>go south</action>", True, "go north", True, ""),
    # missing tags: the env gets the last 30 characters of the lower-cased response
    (LONG_NO_TAGS, True, LONG_NO_TAGS.lower()[-30:], False, "no_action_tags"),
    ("<think>x</think><action>take coin", True, "<think>x</think><action>take coin"[-30:], False,
     "no_action_tags"),
    ("<think>x</think></action>take coin<action>", True, "x</think></action>take coin<action>"[-30:], False,
     "no_action_tags"),
    # missing or misordered think tags: invalid, but the parsed action is still what the env gets
    ("<action>take coin</action>", True, "take coin", False, "no_think_tags"),
    ("<think>x<action>take coin</action>", True, "take coin", False, "no_think_tags"),
    ("</think>x<think><action>take coin</action>", True, "take coin", False, "no_think_tags"),
    ("<action>take coin</action>", False, "take coin", True, ""),
    # nested tags
    ("<think>x</think><action><action>take coin</action></action>", True,
     "<think>x</think><action><action>take coin</action></action>"[-30:], False, "nested_tags"),
    # CJK anywhere in the response
    ("<think>拿硬币</think><action>take coin</action>", True, "take coin", False, "cjk"),
    ("<think>x</think><action>take コイン</action>", True, "take コイン", False, "cjk"),
    ("<think>x</think><action>take 동전</action>", True, "take 동전", False, "cjk"),
    # empty
    ("<think>x</think><action>   </action>", True, "<think>x</think><action>   </action>"[-30:], False, "empty"),
    ("", True, "", False, "no_action_tags"),
]


@pytest.mark.parametrize("response,require_think,action,valid,reason", PARSE_TABLE)
def test_parse_action_table(response, require_think, action, valid, reason):
  parsed = prompting.parse_action(response, require_think=require_think)
  assert (parsed.action, parsed.valid, parsed.reason) == (action, valid, reason)


def test_invalid_tail_is_exactly_30_chars():
  parsed = prompting.parse_action("x" * 100 + "ABCDEFGHIJ" * 3)
  assert parsed.action == "abcdefghij" * 3 and len(parsed.action) == 30


def _history(n):
  return [(f"obs {k}", f"act {k}") for k in range(1, n + 1)]


def _render(history, history_length, obs_chars=0):
  return prompting.render_step_prompt(
      "textworld_express", task_description="Your task is to  find\nthe coin.", history=history,
      observation="You see a coin.", admissible_actions=("take coin", "look around"),
      history_length=history_length, require_think=True, history_obs_chars=obs_chars)


def test_prompt_window_has_exactly_history_length_pairs():
  prompt = _render(_history(7), history_length=3)
  lines = prompt.split("\n")
  assert lines[1] == f"{TASK_LINE_PREFIX} find the coin."
  assert lines[2] == "Your last 3 of 7 steps:"
  assert lines[3:9] == ["Step 5 observation: obs 5", "Step 5 action: act 5", "Step 6 observation: obs 6",
                        "Step 6 action: act 6", "Step 7 observation: obs 7", "Step 7 action: act 7"]
  assert lines[9:12] == ["Step 8 observation (now):", "You see a coin.", "Valid actions: take coin, look around"]
  assert lines[-1].startswith(TURN_LINE_PREFIX) and "<think>" in lines[-1] and "<action>" in lines[-1]
  assert sum(line.startswith(TASK_LINE_PREFIX) for line in lines) == 1
  assert prompt.count(" action: ") == 3


def test_prompt_window_shorter_history_and_zero_length():
  assert _render(_history(2), history_length=5).count(" action: ") == 2
  assert "Your last 2 of 2 steps:" in _render(_history(2), history_length=5)
  no_hist = _render(_history(4), history_length=0)
  assert " action: " not in no_hist and "Step 5 observation (now):" in no_hist
  with pytest.raises(ValueError, match="history_length"):
    _render(_history(1), history_length=-1)


def test_prompt_clips_past_observations_only():
  prompt = _render([("a" * 50, "go")], history_length=1, obs_chars=10)
  assert "Step 1 observation: aaaaaaaaaa ...\n" in prompt
  assert "You see a coin." in prompt


def test_family_prompts_have_task_and_turn_lines():
  from seed_jax.envs import sciworld, textworld_express
  obs_twx = Observation("You are in the kitchen.", "Your task is to find the coin.", ["look around", "take coin"])
  obs_sw = Observation("This room is called the hallway.", "Your task is to boil water.", ["look around", "open OBJ"],
                       {"objects": ["door to kitchen", "air"]})
  for fam, obs in ((textworld_express.FAMILY, obs_twx), (sciworld.FAMILY, obs_sw)):
    cfg = (twx_config if fam.name == "textworld_express" else sw_config).env_config()
    prompt = fam.render_prompt(obs.task_description, _history(9), obs, cfg)
    lines = prompt.split("\n")
    assert lines[1].startswith(TASK_LINE_PREFIX) and lines[-1].startswith(TURN_LINE_PREFIX)
    assert prompt.count(" action: ") == cfg.history_length
  assert "Valid actions: look around, take coin" in textworld_express.FAMILY.render_prompt(
      "t", [], obs_twx, twx_config.env_config())
  sw_prompt = sciworld.FAMILY.render_prompt("t", [], obs_sw, sw_config.env_config())
  assert "look around, open OBJ" in sw_prompt and "door to kitchen, air" in sw_prompt


# tags=("search", "answer"): the earliest complete block wins and is sent in canonical form.
TAGS = ("search", "answer")
TAG_TABLE = [
    ("<think>x</think><Search> Capital of France </Search>", "<search>capital of france</search>", True, ""),
    ("<answer>Paris</answer><search>q</search>", "<answer>paris</answer>", True, ""),
    ("<answer>Paris <search>q</search>", "<search>q</search>", True, ""),  # the only complete block
    ("<search>a <answer>b</answer></search>", "<search>a <answer>b</answer></search>"[-30:], False, "nested_tags"),
    ("<answer> </answer>", "<answer> </answer>", False, "empty"),
    ("<action>go</action>", "<action>go</action>", False, "no_action_tags"),
    ("<answer>巴黎</answer>", "<answer>巴黎</answer>", False, "cjk"),
]


@pytest.mark.parametrize("response,action,valid,reason", TAG_TABLE)
def test_parse_action_with_a_tag_set(response, action, valid, reason):
  parsed = prompting.parse_action(response, require_think=False, tags=TAGS)
  assert (parsed.action, parsed.valid, parsed.reason) == (action, valid, reason)


def test_tag_set_in_turn_line_and_no_tags_is_an_error():
  assert prompting.turn_line(False, TAGS) == (
      f"{TURN_LINE_PREFIX}: give exactly one action inside <search></search> or <answer></answer> (you may think "
      "first inside <think></think>).")
  assert prompting.turn_line(True) == prompting.turn_line(True, ("action",))
  with pytest.raises(ValueError, match="tags"):
    prompting.parse_action("<action>x</action>", tags=())


def test_restrict_maps_onto_a_vocabulary():
  yes_no = lambda text: {"y": "yes", "yes": "yes", "n": "no", "no": "no"}.get(text)
  restrict = lambda r, think=True: prompting.restrict(prompting.parse_action(r, think), yes_no)
  assert restrict("<think>t</think><action>Y</action>") == ParsedAction("yes", True)
  assert restrict("<action>n</action>") == ParsedAction("no", False, "no_think_tags")
  assert restrict("<think>t</think><action>maybe</action>") == ParsedAction("maybe", False, "not_admissible")
  assert restrict("no tags at all") == ParsedAction("no tags at all", False, "no_action_tags")
