"""The honest hindsight annotator: over many generated TextWorldExpress- and ScienceWorld-like trajectories every
quote of its skills is the trajectory's own text and no gold action leaks; the privileged oracle's failure rule
does name an unseen gold action (so the check can fail); exact outputs on three small trajectories."""
import ast
import inspect
import random
import re

from seed_jax import hindsight, sft_oracle, skills
from seed_jax.envs.base import Task
from stage1_helpers import step, trajectory

TASK = Task("twx/coin/train/0", "train", "textworld_express", {})
COIN_TASK = "Your task is to search the environment and find the coin.  Once you find the coin, take it."
KITCHEN = "You are in the kitchen. You see a stove. \nTo the North you see the pantry. To the West you see the corridor. "
PANTRY = "You are in the pantry. You also see a coin. \nTo the South you see the kitchen. "
UNKNOWN = "Unknown action: I'm not sure what you mean."

# ----------------------------------------------------------------------------------------------------------
# Generated trajectories: a random map of rooms, a coin in one of them, and an agent that mixes moves, looks,
# repeats, rejected commands, invalid replies and (rarely) a fatal action.

ROOMS = ("kitchen", "pantry", "corridor", "bedroom", "backyard", "living room", "bathroom", "laundry room")
FURNITURE = ("a stove", "a fridge that is closed", "a counter, that has nothing on it", "a shelf", "a sofa",
             "a bed", "a washing machine that is closed", "a dining chair")
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
GARBAGE = ("fly", "open door to east", "move up", "eat the floor", "take the key")
INVALID = (("<actio", "no_action_tags"), ("I think I should look", "no_think_tags"), ("", "empty"),
           ("<action><action>x</action>", "nested_tags"))
SW_TASK = "Your task is to find a(n) non-living thing. First, focus on the thing. Then, move it to the red box."


def _world(rng: random.Random, n: int) -> dict[str, dict[str, str]]:
  """room -> {direction: neighbour}: a random tree of n rooms."""
  rooms = rng.sample(ROOMS, n)
  exits = {r: {} for r in rooms}
  for i, room in enumerate(rooms[1:], 1):
    for _ in range(8):
      other = rooms[rng.randrange(i)]
      free = [d for d in OPPOSITE if d not in exits[other] and OPPOSITE[d] not in exits[room]]
      if free:
        d = rng.choice(free)
        exits[other][d], exits[room][OPPOSITE[d]] = room, other
        break
  return exits


def _twx_text(room: str, exits: dict[str, str], coin: bool, trap: bool, rng: random.Random) -> str:
  things = " ".join(f"In one part of the room you see {f}." for f in rng.sample(FURNITURE, 2))
  extra = (" You also see a coin." if coin else "") + (" There is also a trapdoor." if trap else "")
  ways = " ".join(f"To the {d.capitalize()} you see the {r}." for d, r in exits.items())
  return f"You are in the {room}. {things}{extra} \n{ways} "


def _sw_text(room: str, exits: dict[str, str]) -> str:
  doors = "".join(f"\tA door to the {r} (that is open)\n" for r in exits.values())
  return (f'This room is called the {room}. In it, you see: \n\tthe agent\n\ta substance called air\n\ta "picture"\n'
          f"You also see:\n{doors}")


def generated(seed: int):
  """One trajectory and the task's gold path (shortest way to the coin, then take it)."""
  rng = random.Random(seed)
  sw = rng.random() < 0.25
  exits = _world(rng, rng.randint(2, 5))
  rooms = list(exits)
  here, coin_room, trap_room = rooms[0], rng.choice(rooms), rng.choice(rooms + [None] * 3)
  move = (lambda d, r: f"go to {r}") if sw else (lambda d, r: f"move {d}")
  text = lambda room: _sw_text(room, exits[room]) if sw else _twx_text(
      room, exits[room], room == coin_room, room == trap_room, rng)
  obs, steps, ret, end = text(here), [], 0.0, "max_steps"
  for _ in range(rng.randint(1, 12)):
    roll = rng.random()
    if steps and roll < 0.15:
      action, valid, reason = steps[-1].action, steps[-1].action_valid, ""
    elif roll < 0.3:
      (action, reason), valid = rng.choice(INVALID), False
    elif roll < 0.4:
      action, valid, reason = rng.choice(GARBAGE), True, ""
    elif roll < 0.55:
      action, valid, reason = rng.choice(("look around", "Look  Around", "inventory")), True, ""
    elif roll < 0.65:
      action, valid, reason = ("focus on picture" if sw else "take coin"), True, ""
    elif roll < 0.7 and here == trap_room and not sw:
      action, valid, reason = "open trapdoor", True, ""
    else:
      d = rng.choice(sorted(exits[here]))
      action, valid, reason = move(d, exits[here][d]), True, ""
    steps.append(step(obs, action, valid, reason))
    act = sft_oracle.norm(action)
    if not valid or act in GARBAGE:
      obs = UNKNOWN
    elif act == "take coin":
      if here == coin_room:
        ret, end = 10.0, "done"
        break
      obs = UNKNOWN
    elif act == "open trapdoor":
      end = "done"
      break
    elif act == "inventory":
      obs = "Inventory (maximum capacity is 2 items): \n  Your inventory is currently empty.\n"
    elif act in ("look around", "focus on picture"):
      obs = text(here) if act == "look around" else "You focus on the picture."
    else:  # a move; a repeated one may lead nowhere from here
      there = next((r for d, r in exits[here].items() if move(d, r) == act), None)
      here, obs = (there, text(there)) if there else (here, UNKNOWN)
  traj = trajectory(TASK, steps, ret, end, SW_TASK if sw else COIN_TASK, traj_id=seed)
  return traj, _gold_path(exits, rooms[0], coin_room, move)


def _gold_path(exits, start, goal, move) -> list[str]:
  paths, todo = {start: []}, [start]
  while todo:
    room = todo.pop(0)
    for d, r in exits[room].items():
      if r not in paths:
        paths[r] = paths[room] + [move(d, r)]
        todo.append(r)
  return ["look around"] + paths[goal] + ["take coin"]


def _fixed_words() -> set[str]:
  """The words of the annotators' own string literals (docstrings left out): every other word of a skill must
  come from its trajectory."""
  words = set()
  for module in (hindsight, sft_oracle):
    tree = ast.parse(inspect.getsource(module))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body and
            isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    words |= {w for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
              and id(n) not in docs for w in re.findall(r"[a-z]+", n.value.lower())}
  return words


def test_hindsight_skills_only_quote_the_trajectory():
  fixed = _fixed_words()
  seen_phrases = set()
  for seed in range(600):
    traj, gold = generated(seed)
    out = hindsight.hindsight_analysis(traj)
    if out is None:
      continue
    summary, skill = out
    assert hindsight.unseen_mentions(traj, summary) == [] and hindsight.unseen_mentions(traj, skill) == [], (seed, out)
    shown = " ".join(hindsight.shown_texts(traj) + [s.info.get("invalid_reason", "") for s in traj.steps] +
                     [traj.termination])
    invented = set(re.findall(r"[a-z]+", skill.lower())) - set(re.findall(r"[a-z]+", shown)) - fixed
    assert not invented, (seed, invented, skill)
    for g in gold:  # a gold action the agent never took or saw written is never named
      if not any(g in t for t in hindsight.shown_texts(traj)):
        assert g not in skill.lower(), (seed, g, skill)
    assert skills.parse_skill(hindsight.hindsight_reply(traj)).skill == skill
    seen_phrases |= {p for p in ("Follow this workflow", "Always reply", "environment did not understand",
                                 "did not change the observation", "you already did", "ended the episode",
                                 "These actions did not finish", "never went there", "which the task names")
                     if p in skill}
  assert len(seen_phrases) == 9, seen_phrases  # every kind of rule and hint was exercised


def test_the_oracle_names_a_gold_action_the_trajectory_never_shows():
  traj = trajectory(TASK, [step(KITCHEN, "look around"), step(KITCHEN, "move west")], 0.0, "max_steps", COIN_TASK)
  _, skill = sft_oracle.oracle_analysis(traj, ["look around", "move north", "take coin"])
  assert hindsight.unseen_mentions(traj, skill) == ["move north"]
  assert "move north" not in hindsight.hindsight_analysis(traj)[1]


def test_unseen_mentions_normalizes_case_spaces_quotes_and_clipping():
  traj = trajectory(TASK, [step('In it, you see: a "picture"\n  and   a BOX.', "Open  Door")], 0.0, "max_steps")
  assert hindsight.unseen_mentions(traj, '"open door" "a \'picture\' and a box." "find the coin"') == []
  clipped = sft_oracle.quote("In it, you see: a picture and a box " * 10)
  assert clipped.endswith(sft_oracle.CLIPPED)
  assert hindsight.unseen_mentions(traj, f'"{clipped}"') == [clipped]  # not one observation's text
  assert hindsight.unseen_mentions(traj, '"move east" and "a box"') == ["move east"]


def test_success_is_the_workflow_of_key_actions():
  traj = trajectory(TASK, [
      step(KITCHEN, "look around"),
      step(KITCHEN, "fly"),  # rejected: not a key action
      step(UNKNOWN, "<act", valid=False, reason="no_action_tags"),
      step(UNKNOWN, "Move  North"),
      step(PANTRY, "take coin"),
  ], 10.0, "done", COIN_TASK)
  assert hindsight.hindsight_analysis(traj) == (
      "The agent completed the task in 5 steps with 3 key actions.",
      "Follow this workflow: 1. look around; 2. move north; 3. take coin. Do the steps in this order, once each, "
      "using the names you observe.")


def test_failure_rule_at_a_rejected_action_and_the_place_never_visited():
  traj = trajectory(TASK, [step(KITCHEN, "look around"), step(KITCHEN, "take coin"), step(UNKNOWN, "move north"),
                           step(PANTRY, "move south")], 0.0, "max_steps", COIN_TASK)
  assert hindsight.hindsight_analysis(traj) == (
      "The agent failed (max_steps, 4 steps) with 0 invalid replies, 1 rejected actions and 0 repeated actions.",
      'When you see "You are in the kitchen.", do not do "take coin": at step 2 the environment did not understand '
      'it. You saw "the corridor" but never went there.')


def test_failure_rule_at_a_loop_and_the_task_object_never_acted_on():
  traj = trajectory(TASK, [step(KITCHEN, "move north"), step(PANTRY, "move south"), step(KITCHEN, "move north"),
                           step(PANTRY, "I would go south", valid=False, reason="no_action_tags")], 0.0, "max_steps",
                    COIN_TASK)
  assert [(m.kind, m.step, m.earlier) for m in hindsight.mistakes(traj)] == [("loop", 2, 0), ("invalid", 3, -1)]
  assert hindsight.hindsight_analysis(traj) == (
      "The agent failed (max_steps, 4 steps) with 1 invalid replies, 0 rejected actions and 1 repeated actions.",
      'When you see "You are in the kitchen." again, try an action you have not tried there: you already did '
      '"move north" there at step 1. You saw "the corridor" but never went there. You saw "a coin", which the task '
      "names, but never acted on it.")


def test_repeat_ended_and_nothing_to_say():
  repeat = trajectory(TASK, [step(KITCHEN, "look around"), step(KITCHEN, "Look around")], 0.0, "done", COIN_TASK)
  assert hindsight.hindsight_analysis(repeat)[1] == (
      'When you see "You are in the kitchen.", do not repeat "look around": at step 1 it did not change the '
      "observation.")
  ended = trajectory(TASK, [step(KITCHEN, "move north"), step(PANTRY, "eat coin")], 0.0, "done", COIN_TASK)
  assert hindsight.hindsight_analysis(ended)[1] == (
      'When you see "You are in the pantry.", do not do "eat coin": at step 2 it ended the episode without success.')
  assert hindsight.hindsight_reply(trajectory(TASK, [], 0.0, "max_steps")) == ""
  crashed = trajectory(TASK, [step(KITCHEN, "look around")], 0.0, "env_error")
  assert hindsight.hindsight_analysis(crashed) is None
  invalid_success = trajectory(TASK, [step(KITCHEN, "x", valid=False)], 10.0, "done")
  assert hindsight.hindsight_reply(invalid_success) == ""
