"""ALFWorld env on authored games in the official on-disk format, played by the real TextWorld PDDL engine.

The data folder is built from tests/fixtures/alfworld by alfworld_data.build_data.
"""
import shutil

import pytest

from alfworld_data import build_data
from configs import alfworld as alfworld_config
from seed_jax.envs import alfworld, base

pytestmark = pytest.mark.slow  # the ALFWorld engine


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
  return build_data(tmp_path_factory.mktemp("alfworld_data"))


def _cfg(data_dir):
  cfg = alfworld_config.env_config()
  cfg.data_dir = data_dir
  return cfg


def test_panels_follow_alfworld_selection_rules_in_a_fixed_order(data_dir):
  cfg = _cfg(data_dir)
  seen = alfworld.FAMILY.tasks(cfg, "valid_seen")
  # Six trial folders: the unsolvable apple->coffeemachine goal, the AppleSliced and the movable-receptacle
  # folders are dropped; the rest comes sorted by path.
  assert [t.task_id for t in seen] == [
    "valid_seen/pick_clean_then_place_in_recep-Mug-None-CoffeeMachine-10/trial_T20190907_212755_456877",
    "valid_seen/pick_heat_then_place_in_recep-Apple-None-DiningTable-10/trial_T20190908_054316_003433",
    "valid_seen/pick_two_obj_and_place-Potato-None-CounterTop-10/trial_T20190909_012518_447851",
  ]
  assert [t.family for t in seen] == ["clean", "heat", "pick_two"]
  assert seen[0].spec == {
    "game_file": "json_2.1.1/valid_seen/pick_clean_then_place_in_recep-Mug-None-CoffeeMachine-10/"
                 "trial_T20190907_212755_456877/game.tw-pddl",
    "task_type": "pick_clean_then_place_in_recep"}
  assert all(t.split == "valid_seen" and t.env == "alfworld" for t in seen)
  unseen = alfworld.FAMILY.tasks(cfg, "valid_unseen")
  assert [t.family for t in unseen] == ["look", "cool"]
  assert [t.family for t in alfworld.FAMILY.tasks(cfg, "train")] == ["pick"]
  # Same panel from a second call and after a JSON round trip (what worker processes receive).
  assert [base.Task.from_json(t.to_json()) for t in seen] == alfworld.FAMILY.tasks(cfg, "valid_seen")


def test_panel_drops_a_trial_without_game_file(data_dir, tmp_path):
  root = tmp_path / "data"
  shutil.copytree(data_dir, root)
  (next(root.glob("json_2.1.1/valid_seen/pick_two*/*")) / "game.tw-pddl").unlink()
  assert [t.family for t in alfworld.FAMILY.tasks(_cfg(str(root)), "valid_seen")] == ["clean", "heat"]


def test_missing_data_and_bad_split_are_clear_errors(tmp_path, monkeypatch):
  monkeypatch.delenv("ALFWORLD_DATA", raising=False)
  with pytest.raises(FileNotFoundError, match="alfworld-download"):
    alfworld.FAMILY.tasks(_cfg(str(tmp_path)), "valid_seen")
  monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="nowhere"):
    alfworld.data_root(alfworld_config.env_config())
  (tmp_path / "json_2.1.1").mkdir()
  with pytest.raises(ValueError, match="split='test'"):
    alfworld.FAMILY.tasks(_cfg(str(tmp_path)), "test")


def test_clean_game_played_to_a_win(data_dir):
  cfg = _cfg(data_dir)
  task = alfworld.FAMILY.tasks(cfg, "valid_seen")[0]
  env = alfworld.FAMILY.make_env(cfg)
  obs = env.reset(task)
  assert obs.text == (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you "
    "see a cabinet 1, a coffeemachine 1, a countertop 1, a diningtable 1, a fridge 1, a microwave 1, and a "
    "sinkbasin 1.\n\nYour task is to: clean some mug and put it in coffeemachine.")
  assert obs.task_description == "clean some mug and put it in coffeemachine."
  assert obs.admissible == ["go to cabinet 1", "go to coffeemachine 1", "go to countertop 1",
                            "go to diningtable 1", "go to fridge 1", "go to microwave 1", "go to sinkbasin 1",
                            "inventory", "look"]  # the engine also offers "help", which is dropped
  gold = env.gold_actions()
  assert gold == ["go to countertop 1", "take mug 1 from countertop 1", "go to sinkbasin 1",
                  "clean mug 1 with sinkbasin 1", "go to coffeemachine 1", "move mug 1 to coffeemachine 1"]
  feedback, rewards = [], []
  for action in gold:
    result = env.step(action)
    feedback.append(result.observation.text)
    rewards.append(result.reward)
  assert feedback[0] == "You arrive at countertop 1. On the countertop 1, you see a mug 1."
  assert feedback[3] == "You clean the mug 1 using the sinkbasin 1."
  assert rewards == [0.0] * 5 + [10.0]
  assert result.done and result.info == {"success": True, "score": 1.0, "won": True}
  # A second reset of the same game starts from the initial state again.
  assert env.reset(task).text == obs.text
  env.close()


def test_heat_game_played_to_a_loss(data_dir):
  cfg = _cfg(data_dir)
  task = alfworld.FAMILY.tasks(cfg, "valid_seen")[1]
  env = alfworld.FAMILY.make_env(cfg)
  assert env.reset(task).task_description == "heat some apple and put it in diningtable."
  # Cooling instead of heating: every step is legal, the goal never holds within the 30-step cap.
  script = ["go to fridge 1", "open fridge 1", "take apple 1 from fridge 1", "cool apple 1 with fridge 1",
            "go to diningtable 1", "move apple 1 to diningtable 1"]
  results = [env.step(a) for a in script]
  assert results[2].observation.text == "You pick up the apple 1 from the fridge 1."
  assert results[5].observation.text == "You move the apple 1 to the diningtable 1."
  wait = [env.step("look") for _ in range(cfg.max_steps - len(script))]
  assert not any(r.done or r.reward for r in results + wait)
  assert wait[-1].info == {"success": False, "score": 0.0, "won": False}
  # A command outside the admissible list changes nothing.
  assert env.step("fly to the moon").observation.text == "Nothing happens."
  env.close()


def test_pick_two_and_look_families_are_winnable(data_dir):
  cfg = _cfg(data_dir)
  env = alfworld.FAMILY.make_env(cfg)
  for task in [alfworld.FAMILY.tasks(cfg, "valid_seen")[2], alfworld.FAMILY.tasks(cfg, "valid_unseen")[0]]:
    env.reset(task)
    results = [env.step(a) for a in env.gold_actions()]
    assert [r.done for r in results] == [False] * (len(results) - 1) + [True], task.task_id
    assert results[-1].reward == 10.0
  assert results[-1].observation.text == "You turn on the desklamp 1."
  env.close()


def test_prompt_and_action_parsing():
  cfg = alfworld_config.env_config()
  obs = base.Observation("You arrive at countertop 1.", "put a mug in cabinet.", ["look", "inventory"])
  history = [(f"obs {i}", f"act {i}") for i in range(7)]
  prompt = alfworld.FAMILY.render_prompt("put a mug in cabinet.", history, obs, cfg)
  lines = prompt.split("\n")
  assert sum(line.startswith(base.TASK_LINE_PREFIX) for line in lines) == 1
  assert lines[-1].startswith(base.TURN_LINE_PREFIX)
  assert "obs 1" not in prompt and "obs 2" in prompt and "obs 6" in prompt  # last 5 pairs only
  assert lines[-3:-1] == ["You arrive at countertop 1.", "Your admissible actions: look, inventory"]
  parse = lambda r: alfworld.FAMILY.parse_action(r, cfg)
  assert parse("<think>go</think><action>Go To Cabinet 1</action>") == base.ParsedAction("go to cabinet 1", True)
  assert parse("<action>look</action>") == base.ParsedAction("look", False, "no_think_tags")
  # No action tags: the last 30 characters go to the env.
  bad = parse("<think>x</think> I will just look around the room now")
  assert bad == base.ParsedAction(" just look around the room now", False, "no_action_tags")
  assert parse("<think>看</think><action>look</action>").reason == "cjk"
