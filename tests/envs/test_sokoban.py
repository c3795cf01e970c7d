"""Sokoban env: push rules, gym-sokoban rewards, the solver as oracle, observations and action parsing."""
import numpy as np
import pytest

from configs import sokoban as sokoban_config
from seed_jax.envs import base, sokoban, sokoban_levels


def _env(**overrides):
  cfg = sokoban_config.env_config()
  cfg.update(overrides)
  return sokoban.FAMILY.make_env(cfg), cfg


def _task(rows):
  return base.Task("scripted", "test", "sokoban", {"rows": rows})


def test_solver_solves_generated_levels():
  env, cfg = _env()
  lengths = []
  for task in sokoban.FAMILY.tasks(cfg, "test")[:150]:
    env.reset(task)
    gold = env.gold_actions()
    assert gold is not None and 1 <= len(gold) <= cfg.search_depth
    total = 0.0
    for k, a in enumerate(gold):
      r = env.step(a)
      total += r.reward
      assert r.done == (k == len(gold) - 1)
    assert r.info["success"] and r.info["score"] == 1.0 and not r.info["truncated"]
    # 1 box: every step costs 0.1, the last push earns +1 (box on target) and +10 (solved).
    assert total == pytest.approx(-0.1 * len(gold) + 11.0)
    lengths.append(len(gold))
  assert max(lengths) >= 5  # not only one-push levels


def test_scripted_path_rewards():
  env, _ = _env()
  obs = env.reset(_task(["######",
                         "#P___#",
                         "#_X_O#",
                         "#____#",
                         "######"]))
  assert obs.text.splitlines()[1] == "# P _ _ _ #" and obs.admissible == ["up", "down", "left", "right"]
  rewards = [env.step(a).reward for a in ("up", "down", "right")]  # wall bump, walk, push (not on target yet)
  assert rewards == pytest.approx([-0.1, -0.1, -0.1])
  last = env.step("right")  # push onto the target: -0.1 + 1 + 10
  assert last.reward == pytest.approx(10.9) and last.done and last.info["success"]
  assert last.observation.text.splitlines()[2] == "# _ _ P √ #"
  assert sum(rewards) + last.reward == pytest.approx(10.6)


def test_walls_and_unpushable_boxes():
  env, _ = _env()
  env.reset(_task(["#####",
                   "#OPX#",
                   "#####"]))
  r = env.step("right")  # box backed by a wall does not move, nor does the player
  assert (r.reward, r.info["moved"], r.observation.text.splitlines()[1]) == (pytest.approx(-0.1), False, "# O P X #")
  r = env.step("left")  # the player may stand on a target
  assert r.observation.text.splitlines()[1] == "# S _ X #" and r.reward == pytest.approx(-0.1) and not r.done

  env.reset(_task(["#######",
                   "#P√_XO#",
                   "#######"]))
  r = env.step("right")  # pushes a box off its target: -0.1 - 1
  assert r.reward == pytest.approx(-1.1) and r.observation.text.splitlines()[1] == "# _ S X X O #"
  assert (r.info["boxes_on_target"], r.info["score"]) == (0, 0.0)
  r = env.step("right")  # a box backed by another box does not move
  assert (r.reward, r.info["moved"]) == (pytest.approx(-0.1), False)
  r = env.step("jump")  # not an action: a no-op step that still costs the step penalty
  assert (r.reward, r.info["invalid_action"], r.info["moved"]) == (pytest.approx(-0.1), True, False)


def test_max_steps_truncates():
  env, _ = _env(max_steps=3)
  env.reset(_task(["#####", "#OPX#", "#####"]))
  results = [env.step("up") for _ in range(3)]
  assert [r.done for r in results] == [False, False, True] and results[-1].info["truncated"]
  with pytest.raises(ValueError, match="after the episode ended"):
    env.step("up")


def test_image_observation():
  env, _ = _env(tile_px=16)
  obs = env.reset(_task(["#####", "#OPX#", "#####"]))
  img = obs.info["image"]
  assert img.shape == (48, 80, 3) and img.dtype == np.uint8
  assert tuple(img[24, 40]) == sokoban._COLORS["player"]  # centre of the player's cell (1, 2)
  assert tuple(img[16 + 2, 16 + 8]) == sokoban._COLORS["target"]  # the target ring in cell (1, 1)
  assert tuple(img[16 + 2, 48 + 8]) == sokoban._COLORS["box_edge"]  # the crate's edge in cell (1, 3)
  assert tuple(img[4, 4]) == sokoban._COLORS["wall"]


def test_parse_action():
  parse = lambda r, require_think=True: sokoban.parse_action(r, _env(require_think=require_think)[1])
  assert parse("<think>box is right</think><action>Right</action>") == base.ParsedAction("right", True)
  assert parse("<think>t</think><action> move up. </action>") == base.ParsedAction("up", True)
  assert parse("<think>t</think><action>up or down</action>").reason == "not_admissible"
  assert parse("<action>up</action>") == base.ParsedAction("up", False, "no_think_tags")  # still sent
  assert parse("<action>jump</action>", require_think=False) == base.ParsedAction("jump", False, "not_admissible")
  assert parse("<action>up</action>", require_think=False) == base.ParsedAction("up", True)
  assert parse("I go up").reason == "no_action_tags"
  assert parse("<think>向上</think><action>up</action>").reason == "cjk"
  assert parse("x" * 40 + "<think></think><action></action>").action == "<think></think><action></action>"[-30:]


def test_prompt_and_tasks():
  env, cfg = _env()
  tasks = sokoban.FAMILY.tasks(cfg, "test")
  assert len(tasks) == 128 and tasks[0].task_id == "sokoban-test-1000000" and tasks[0].family == "6x6-1box"
  assert tasks == sokoban.FAMILY.tasks(cfg, "test")
  assert sokoban.FAMILY.tasks(cfg, "train")[5].spec["seed"] == 5
  obs = env.reset(tasks[0])
  assert obs.text == "\n".join(sokoban.render_rows(*sokoban_levels.generate_level(1_000_000)))
  prompt = sokoban.FAMILY.render_prompt(obs.task_description, [], obs, cfg)
  lines = prompt.splitlines()
  assert "Your task: push the box onto the target." in lines and obs.text in prompt
  assert lines[-1].startswith(base.TURN_LINE_PREFIX)
  cfg.observation, cfg.history_length = "image", 2
  prompt = sokoban.FAMILY.render_prompt(obs.task_description, [("g1", "up"), ("g2", "left"), ("g3", "down")], obs, cfg)
  assert "<image>" in prompt and obs.text not in prompt and "g1" not in prompt
  assert "Step 3 observation: g3\nStep 3 action: down\nStep 4 observation (now):\n<image>\n" in prompt
  cfg.observation = "pixels"
  with pytest.raises(ValueError, match="observation"):
    sokoban.FAMILY.make_env(cfg)
  cfg.observation, cfg.render_image = "image", False
  with pytest.raises(ValueError, match="render_image"):
    sokoban.FAMILY.make_env(cfg)
  cfg.observation = "text"
  assert "image" not in sokoban.FAMILY.make_env(cfg).reset(tasks[0]).info
