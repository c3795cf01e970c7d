"""EZPoints: the oracle on every rank pair, invalid tokens, card reuse, evaluation, observations, parsing."""
import itertools

import numpy as np
import pytest

from configs import ezpoints as ezpoints_config
from seed_jax import warmstart
from seed_jax.envs import base, ezpoints, ezpoints_image


def _env(**overrides):
  cfg = ezpoints_config.env_config()
  cfg.update(overrides)
  return ezpoints.FAMILY.make_env(cfg), cfg


def _task(cards):
  return base.Task("t", "test", "ezpoints", {"cards": cards})


def test_oracle_solves_every_solvable_rank_pair():
  env, _ = _env()
  solvable = []
  for r1, r2 in itertools.product(ezpoints.RANKS, repeat=2):
    env.reset(_task(["H" + r1, "S" + r2]))
    gold = env.gold_actions()
    if gold is None:
      continue
    solvable.append(r1 + "," + r2)
    results = [env.step(tok) for tok in gold]
    assert [r.reward for r in results] == [0.0, 0.0, 0.0, 10.0] and results[-1].done
    assert results[-1].info["success"] and results[-1].info["value"] == 12
  # Value pairs making 12: 2+10, 3+9, 4+8, 5+7, 6+6, 2*6, 3*4; the value 10 is any of 10, J, Q, K.
  assert sorted(solvable) == sorted(
      [f"2,{t}" for t in ("10", "J", "Q", "K")] + [f"{t},2" for t in ("10", "J", "Q", "K")] +
      ["3,9", "9,3", "4,8", "8,4", "5,7", "7,5", "6,6", "2,6", "6,2", "3,4", "4,3"])
  assert len(solvable) == 19  # of 169 ordered rank pairs; the other 150 have no formula


def test_unsolvable_pairs_are_identified():
  assert ezpoints.solution([1, 10]) is None and ezpoints.solution([7, 7]) is None
  assert ezpoints.solution([6, 6]) == ["6", "+", "6", "="] and ezpoints.solution([4, 3]) == ["4", "*", "3", "="]
  env, _ = _env()
  env.reset(_task(["CA", "DK"]))
  assert env.gold_actions() is None


def test_dealt_pairs_are_reproducible_and_solvable():
  assert ezpoints.deal(0) == ["H4", "C8"] and ezpoints.deal(5) == ["SJ", "S2"]
  for seed in range(2000):
    cards = ezpoints.deal(seed)
    assert cards == ezpoints.deal(seed)
    assert ezpoints.solution([ezpoints.card_value(c) for c in cards]) is not None
  with pytest.raises(ValueError, match="suit"):
    ezpoints.card_value("X7")


def test_evaluation_precedence_and_parse_errors():
  assert ezpoints.evaluate(["2", "+", "3", "*", "4"]) == 14
  assert ezpoints.evaluate(["2", "*", "3", "+", "4"]) == 10
  assert ezpoints.evaluate(["10"]) == 10
  for bad in ([], ["+", "2"], ["2", "+"], ["2", "6"], ["2", "+", "+", "6"]):
    assert ezpoints.evaluate(bad) is None


def test_invalid_character_and_reuse():
  env, _ = _env()
  env.reset(_task(["H6", "S2"]))
  r = env.step("-")
  assert (r.reward, r.done, r.info["invalid_action"], r.info["formula"]) == (0.0, False, "unknown_character", "")
  assert env.step("6").info["formula"] == "6"
  r = env.step("6")  # the only 6 is already used
  assert (r.info["invalid_action"], r.info["formula"], r.done) == ("card_not_available", "6", False)
  r = env.step("5")  # no card shows a 5
  assert r.info["invalid_action"] == "card_not_available"
  env.step("*")
  env.step("2")
  r = env.step("=")
  assert (r.reward, r.done, r.info["success"], r.info["value"]) == (10.0, True, True, 12)
  env.reset(_task(["H6", "S6"]))  # two cards of the same value may both be used
  assert [env.step(t).reward for t in ("6", "+", "6", "=")] == [0.0, 0.0, 0.0, 10.0]


def test_equals_on_bad_or_incomplete_formulas():
  env, _ = _env()
  env.reset(_task(["H2", "SK"]))
  r = env.step("=")
  assert (r.reward, r.done, r.info["parse_error"], r.info["value"]) == (0.0, True, True, None)
  env.reset(_task(["H2", "SK"]))
  for t in ("2", "10"):
    env.step(t)
  r = env.step("=")  # adjacent numbers do not concatenate
  assert (r.reward, r.info["parse_error"]) == (0.0, True)
  env.reset(_task(["H2", "SK"]))
  env.step("10")
  r = env.step("=")
  assert (r.reward, r.done, r.info["cards_unused"], r.info["value"]) == (0.0, True, True, 10)
  env.reset(_task(["H2", "SK"]))
  for t in ("2", "*", "10"):
    env.step(t)
  r = env.step("=")
  assert (r.reward, r.info["value"], r.info["success"]) == (0.0, 20, False)
  with pytest.raises(ValueError, match="after the episode ended"):
    env.step("=")


def test_max_steps():
  env, _ = _env(max_steps=8)
  env.reset(_task(["H2", "SK"]))
  results = [env.step("+") for _ in range(8)]
  assert [r.done for r in results] == [False] * 7 + [True] and results[-1].info["truncated"]
  assert results[-1].reward == 0.0


def test_observations():
  env, _ = _env()
  obs = env.reset(_task(["HQ", "S10"]))
  assert obs.text == "Cards: queen of hearts, 10 of spades\nFormula: (empty)"
  assert obs.admissible == ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "+", "*", "="]
  img = obs.info["image"]
  assert img.shape == (300, 300, 3) and img.dtype == np.uint8
  green, white, red, black = ezpoints_image._GREEN, ezpoints_image._WHITE, ezpoints_image._RED, ezpoints_image._BLACK
  assert tuple(img[2, 2]) == green and tuple(img[150, 20]) == white
  left, right = img[:, :150].reshape(-1, 3), img[:, 150:].reshape(-1, 3)
  assert (left == red).all(-1).sum() > 500 and (left == black).all(-1).sum() == 0  # hearts
  assert (right == black).all(-1).sum() > 500 and (right == red).all(-1).sum() == 0  # spades
  r = env.step("10")
  assert r.observation.text.endswith("Formula: 10")
  assert (r.observation.info["image"][255:275] == white).all(-1).sum() > 50  # the formula is drawn


def test_parse_action_and_prompt():
  parse = lambda r, require_think=True: ezpoints.parse_action(r, _env(require_think=require_think)[1])
  assert parse("<think>10+2</think><action>10</action>") == base.ParsedAction("10", True)
  assert parse("<think>t</think><action> '+' </action>") == base.ParsedAction("+", True)
  assert parse("<think>t</think><action>-</action>").reason == "not_admissible"
  assert parse("<think>t</think><action>10 + 2</action>").reason == "not_admissible"
  assert parse("<action>=</action>").reason == "no_think_tags"
  assert parse("<action>=</action>", require_think=False) == base.ParsedAction("=", True)
  assert parse("<think>十</think><action>1</action>").reason == "cjk"
  env, cfg = _env()
  obs = env.reset(_task(["HQ", "S2"]))
  lines = ezpoints.FAMILY.render_prompt(obs.task_description, [], obs, cfg).splitlines()
  assert "Your task: build a formula from the two cards that evaluates to 12." in lines
  assert "Cards: queen of hearts, 2 of spades" in lines and lines[-1].startswith(base.TURN_LINE_PREFIX)
  cfg.observation = "image"
  prompt = ezpoints.FAMILY.render_prompt(obs.task_description, [], obs, cfg)
  assert "<image>\nFormula: (empty)" in prompt and "queen" not in prompt
  cfg.render_image = False
  with pytest.raises(ValueError, match="render_image"):
    ezpoints.FAMILY.make_env(cfg)
  cfg.observation = "text"
  assert ezpoints.FAMILY.make_env(cfg).reset(_task(["HQ", "S2"])).info == {}


def test_json_answers_are_read_as_gym_cards_reads_them():
  env, cfg = _env(answer_format="json")
  parse = lambda r: ezpoints.FAMILY.parse_action(r, cfg)
  assert parse('{"thoughts": "Q is 10, 10+2=12", "action": "10"}') == base.ParsedAction("10", True)  # 10, not 1
  assert parse('{"cards": [10, 2], "formula": "10+", "action": "2"}') == base.ParsedAction("2", True)
  assert parse('{"action": "*"}') == base.ParsedAction("*", True)  # no think tags asked for
  assert parse('{"action": "+", "note": "then 2"}').reason == "ambiguous"  # the key's tail names + and 2
  assert parse('{"action": "-"}').reason == "no_action_tags"  # not in the vocabulary
  assert parse("I would play 3") == base.ParsedAction("3", True)  # no key: its last character (the reference's -1)
  assert parse("I would play 3.").reason == "no_action_tags"
  assert ezpoints.FAMILY.parse_action('{"action": "3"}', _env()[1]).reason == "no_action_tags"  # "tags" default
  obs = env.reset(_task(["HQ", "S2"]))
  prompt = ezpoints.FAMILY.render_prompt(obs.task_description, [], obs, cfg)
  assert prompt.splitlines()[-1] == ezpoints.JSON_TURN_LINE and "<action>" not in prompt
  assert env.step(parse('{"action": "10"}').action).observation.text.splitlines()[-1] == "Formula: 10"
  with pytest.raises(ValueError, match="answer_format"):
    _env(answer_format="xml")
  for tok, reasoning in itertools.product(ezpoints.VOCAB, (True, False)):  # the warm start's gold replies parse
    assert parse(warmstart.demo_response(tok, reasoning, "json")) == base.ParsedAction(tok, True)


def test_task_panels():
  _, cfg = _env()
  tasks = ezpoints.FAMILY.tasks(cfg, "test")
  assert len(tasks) == 128 and tasks == ezpoints.FAMILY.tasks(cfg, "test")
  assert tasks[0].spec == {"seed": 1_000_000, "cards": ezpoints.deal(1_000_000)}
  assert {t.family for t in tasks} == {"sum", "product"}
  train = ezpoints.FAMILY.tasks(cfg, "train")
  assert train[0].spec["cards"] == ["H4", "C8"] and train[0].family == "sum"
  assert train[1].spec["cards"] == ["H4", "C3"] and train[1].family == "product"
