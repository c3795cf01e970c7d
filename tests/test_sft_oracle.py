"""The oracle analyzer on constructed trajectories, with gold paths read from the real simulators."""
import json

import pytest

from configs import sciworld as sw_config
from configs import textworld_express as twx_config
from seed_jax import sft_oracle, skills
from seed_jax.envs import get_family
from seed_jax.envs import sciworld as sw
from seed_jax.envs import textworld_express as twx
from stage1_helpers import step, trajectory

pytestmark = pytest.mark.slow  # gold paths from the ScienceWorld and TextWorldExpress JVMs

KITCHEN = "You are in the kitchen. To the East you see the pantry."
PANTRY = "You are in the pantry. You also see a coin."
UNKNOWN = "Unknown action: I'm not sure what you mean."


@pytest.fixture(scope="module")
def twx_gold():
  cfg = twx_config.get_config("collect")
  task = twx.task_panel(cfg.env, "train")[459]
  [gold] = sft_oracle.fetch_gold_paths(get_family("textworld_express"), cfg.env, [task], 1)
  return task, gold


def test_textworld_express_gold_path(twx_gold):
  task, gold = twx_gold
  assert task.task_id == "twx/coin/train/459"
  assert gold == ["look around", "move east", "take coin"]


def test_success_yields_the_workflow_of_key_actions(twx_gold):
  task, gold = twx_gold
  traj = trajectory(task, [
      step(KITCHEN, "look around"),
      step(KITCHEN, "fly"),  # rejected by the simulator (next observation): not a key action
      step(UNKNOWN, "<actio", valid=False, reason="no_action_tags"),  # invalid: not a key action
      step(UNKNOWN, "Move  East"),  # normalized
      step(PANTRY, "look around"),
      step(PANTRY, "look around"),  # immediate repeat: collapsed
      step(PANTRY, "take coin"),
  ], 10.0, "done")
  assert sft_oracle.key_actions(traj) == ["look around", "move east", "look around", "take coin"]
  assert sft_oracle.oracle_analysis(traj, gold) == (
      "The agent completed the task in 7 steps with 4 key actions.",
      "Follow this workflow: 1. look around; 2. move east; 3. look around; 4. take coin. Do the steps in this "
      "order, once each, using the names you observe.")
  # A success needs no gold path: it is the workflow the honest annotator writes too.
  assert sft_oracle.oracle_analysis(traj, None) == sft_oracle.oracle_analysis(traj, gold)
  assert sft_oracle.oracle_analysis(traj, gold) == sft_oracle.workflow_analysis(traj)


def test_failure_yields_the_rule_at_the_first_divergence(twx_gold):
  task, gold = twx_gold
  wrong = trajectory(task, [step(KITCHEN, "look around"), step(KITCHEN, "move west"), step(UNKNOWN, "move east")],
                     0.0, "max_steps")
  assert sft_oracle.first_divergence(wrong, gold) == 1
  assert sft_oracle.oracle_analysis(wrong, gold) == (
      'The agent failed (max_steps, 3 steps); at step 2 it did "move west" where the gold path does "move east".',
      'When you see "You are in the kitchen. To the East you see the pantry.", do "move east" instead of '
      '"move west".')
  invalid = trajectory(task, [step(KITCHEN, "ok i will look", valid=False, reason="no_think_tags")], 0.0, "max_steps")
  assert sft_oracle.oracle_analysis(invalid, gold) == (
      "The agent failed (max_steps, 1 steps); at step 1 its reply was not a valid action (no_think_tags).",
      'When you see "You are in the kitchen. To the East you see the pantry.", reply with a valid action in the '
      'required format: "look around".')
  # The reply is the analyzers' JSON and parses back to the same rule.
  reply = sft_oracle.oracle_reply(wrong, gold)
  assert json.loads(reply) == {"episode_summary": sft_oracle.oracle_analysis(wrong, gold)[0],
                               "episode_skill": sft_oracle.oracle_analysis(wrong, gold)[1]}
  assert skills.parse_skill(reply).skill == sft_oracle.oracle_analysis(wrong, gold)[1]


def test_oracle_has_nothing_to_say(twx_gold):
  task, gold = twx_gold
  failed = trajectory(task, [step(KITCHEN, "move west")], 0.0, "max_steps")
  assert sft_oracle.oracle_reply(failed, None) == "" and sft_oracle.oracle_reply(failed, []) == ""
  whole_path = trajectory(task, [step(KITCHEN, a) for a in gold] + [step(PANTRY, "look around")], 0.0, "max_steps")
  assert sft_oracle.oracle_analysis(whole_path, gold) is None
  only_rejected = trajectory(task, [step(KITCHEN, "fly"), step(UNKNOWN, "take coin")], 10.0, "done")
  assert sft_oracle.key_actions(only_rejected) == ["take coin"]
  nothing = trajectory(task, [step(KITCHEN, "x", valid=False)], 10.0, "done")
  assert sft_oracle.oracle_analysis(nothing, gold) is None


def test_sciworld_rules_from_the_simulator_gold_path():
  cfg = sw_config.get_config("annotate")
  cfg.env.task_types = "find-non-living-thing"
  task = sw.task_panel(cfg.env, "train")[0]
  [gold] = sft_oracle.fetch_gold_paths(get_family("sciworld"), cfg.env, [task], 1)
  assert task.task_id == "sciworld/find-non-living-thing/0"
  assert gold == ["open door to kitchen", "go to kitchen", "look around", "focus on painting",
                  "move painting to red box"]
  hallway = 'This room is called the hallway. In it, you see: the agent, a substance called air, a "picture". ' * 2
  stalled = trajectory(task, [step(hallway, "open door to kitchen"), step("The door is now open.", "go to kitchen")],
                       0.0, "max_steps", description="find a non-living thing")
  assert sft_oracle.oracle_analysis(stalled, gold) == (
      'The agent failed (max_steps, 2 steps) while still on the gold path; the next gold action was "look around".',
      'Do not stop or stall after "go to kitchen": continue with "look around".')
  wrong = trajectory(task, [step(hallway, "focus on picture")], 0.0, "done")
  # The warning sign is the observation on one line, double quotes made single, clipped to 160 characters
  # (97 + 63: the second copy is cut after "a s").
  assert sft_oracle.oracle_analysis(wrong, gold) == (
      'The agent failed (done, 1 steps); at step 1 it did "focus on picture" where the gold path does '
      '"open door to kitchen".',
      "When you see \"This room is called the hallway. In it, you see: the agent, a substance called air, a "
      "'picture'. This room is called the hallway. In it, you see: the agent, a s ...\", do "
      "\"open door to kitchen\" instead of \"focus on picture\".")
  solved = trajectory(task, [step(hallway, a) for a in gold], 10.0, "done")
  assert sft_oracle.oracle_analysis(solved, gold)[1] == (
      "Follow this workflow: 1. open door to kitchen; 2. go to kitchen; 3. look around; 4. focus on painting; "
      "5. move painting to red box. Do the steps in this order, once each, using the names you observe.")
