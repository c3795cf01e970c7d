"""EZPoints (gym-cards): build a formula from two cards that equals 12, one token per step.

Tokens are a card's number "1".."10" (J, Q and K count 10, A counts 1), "+", "*" and "="; "=" evaluates the
formula and ends the episode with reward 10 iff it equals 12 and both cards were used. Semantics, following
gym-cards' EZPointEnv where it defines them:
- a token outside that vocabulary, or a number that is not an unused card (a reused card, or a number no card
  shows), is an invalid action: the formula is unchanged, reward 0, the episode goes on (info["invalid_action"]
  names the reason); the step still counts toward max_steps.
- operators are appended unchecked; "=" on a formula that does not parse (empty, leading/trailing/doubled
  operator, or two adjacent numbers) ends the episode with reward 0 (info["parse_error"]). gym-cards evaluates
  with Python's eval, where adjacent numbers would concatenate ("1" "2" -> 12); here they do not parse.
- "=" with a card left unused ends the episode with reward 0, as in gym-cards.
- the episode ends unsolved (info["truncated"]) after max_steps steps.
Cards are dealt from a seed as gym-cards' `_generate_cards` does (every dealt pair is solvable); explicit
pairs, solvable or not, can be given in Task.spec["cards"]. Observations: text and an RGB image (numpy,
drawn by ezpoints_image).
"""
from __future__ import annotations

import random
from typing import Any, Sequence

import ml_collections

from seed_jax.envs import base, prompting
from seed_jax.envs.ezpoints_image import render_image

NAME = "ezpoints"
TARGET = 12
NUMBERS = tuple(str(v) for v in range(1, 11))
VOCAB = NUMBERS + ("+", "*", "=")
SUITS = {"H": "hearts", "D": "diamonds", "S": "spades", "C": "clubs"}
RANKS = ("A", "2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K")
_RANK_WORD = {"A": "ace", "J": "jack", "Q": "queen", "K": "king"}


def card_value(card: str) -> int:
  """'H7' -> 7, 'SK' -> 10, 'CA' -> 1 (suit letter, then rank; 'T' also means 10)."""
  suit, rank = card[:1].upper(), card[1:].upper().replace("T", "10")
  if suit not in SUITS or rank not in RANKS:
    raise ValueError(f"card {card!r}: expected a suit in {sorted(SUITS)} then a rank in {RANKS}")
  return min(RANKS.index(rank) + 1, 10)


def card_name(card: str) -> str:
  rank = card[1:].upper().replace("T", "10")
  return f"{_RANK_WORD.get(rank, rank)} of {SUITS[card[:1].upper()]}"


def deal(seed: int) -> list[str]:
  """gym-cards' _generate_cards: a first card 2..K, a second one that makes 12 with it by * (half the time
  when the first divides 12) or by +, in random order."""
  rng = random.Random(seed)
  first = rng.randint(2, 13)
  cards = [rng.choice(list(SUITS)) + RANKS[first - 1]]
  v = min(first, 10)
  second = TARGET // v if v in (1, 2, 3, 4, 6) and rng.random() <= 0.5 else TARGET - v
  cards.append(rng.choice(list(SUITS)) + str(second))
  return cards[::-1] if rng.random() <= 0.5 else cards


def evaluate(tokens: Sequence[str]) -> int | None:
  """Value of number (op number)* with * binding tighter than +; None if it does not parse."""
  if len(tokens) % 2 == 0:
    return None
  total, product = 0, 1
  for k, tok in enumerate(tokens):
    if k % 2 == 0:
      if tok not in NUMBERS:
        return None
      product *= int(tok)
    elif tok == "+":
      total, product = total + product, 1
    elif tok != "*":
      return None
  return total + product


def solution(values: Sequence[int]) -> list[str] | None:
  """The oracle's tokens for two card values, or None when no formula makes 12."""
  a, b = values
  if a + b == TARGET:
    return [str(a), "+", str(b), "="]
  if a * b == TARGET:
    return [str(a), "*", str(b), "="]
  return None


# ------------------------------------------------------------------------------------------ env


class EZPointsEnv:

  def __init__(self, cfg: ml_collections.ConfigDict):
    self.cfg = cfg
    self._cards: list[str] = []
    self._values: list[int] = []
    self._formula: list[str] = []
    self._steps, self._done = 0, True

  def reset(self, task: base.Task) -> base.Observation:
    cards = task.spec["cards"] if "cards" in task.spec else deal(int(task.spec["seed"]))
    if len(cards) != 2:
      raise ValueError(f"ezpoints task {task.task_id!r}: expected two cards, got {cards!r}")
    self._values = [card_value(c) for c in cards]  # validates the card codes
    self._cards, self._formula, self._steps, self._done = list(cards), [], 0, False
    return self._observation()

  def _observation(self) -> base.Observation:
    text = (f"Cards: {card_name(self._cards[0])}, {card_name(self._cards[1])}\n"
            f"Formula: {' '.join(self._formula) if self._formula else '(empty)'}")
    info = {"image": render_image(self._cards, self._formula)} if self.cfg.render_image else {}
    return base.Observation(text, f"build a formula from the two cards that evaluates to {TARGET}.", list(VOCAB), info)

  def _available(self, tok: str) -> bool:
    used = [t for t in self._formula if t in NUMBERS].count(tok)
    return used < self._values.count(int(tok))

  def step(self, action: str) -> base.StepResult:
    if not self._cards or self._done:
      raise ValueError("EZPointsEnv.step called before reset or after the episode ended")
    tok = action.strip()
    info: dict[str, Any] = {"success": False, "score": 0.0, "invalid_action": "", "truncated": False}
    reward, done = 0.0, False
    if tok not in VOCAB:
      info["invalid_action"] = "unknown_character"
    elif tok in NUMBERS and not self._available(tok):
      info["invalid_action"] = "card_not_available"
    elif tok == "=":
      done, value = True, evaluate(self._formula)
      all_used = sorted(int(t) for t in self._formula if t in NUMBERS) == sorted(self._values)
      info.update(value=value, parse_error=value is None, cards_unused=not all_used)
      if value == TARGET and all_used:
        reward = self.cfg.success_reward
        info.update(success=True, score=1.0)
    else:
      self._formula.append(tok)
    self._steps += 1
    if not done and self._steps >= self.cfg.max_steps:
      done, info["truncated"] = True, True
    self._done = done
    info["formula"] = " ".join(self._formula)
    return base.StepResult(self._observation(), reward, done, info)

  def gold_actions(self) -> list[str] | None:
    return solution(self._values) if self._values else None

  def close(self) -> None:
    pass


# ------------------------------------------------------------------------------------------ prompts and actions

def _token(text: str) -> str | None:
  """The vocabulary token an action text is (surrounding quotes ignored), else None."""
  tok = text.strip("'\"` ")
  return tok if tok in VOCAB else None


def parse_json_action(response: str) -> base.ParsedAction:
  """gym-cards' reading of a JSON answer (`"action": "3"`), as verl-agent's EZPoints projection does it: the
  lower-cased text from `"action":` on (the last character when the key is missing) must name exactly one
  vocabulary token, "10" counted before "1"; otherwise invalid ("no_action_tags" with no token, "ambiguous"
  with several), and the env gets the response's tail."""
  text = response.lower()
  at = text.find('"action":')
  rest = text[at:] if at >= 0 else text[-1:]
  found = {"10"} if "10" in rest else set()
  rest = rest.replace("10", "")
  found |= {tok for tok in VOCAB if tok in rest}
  if len(found) == 1:
    return base.ParsedAction(found.pop(), True)
  return base.ParsedAction(text[-prompting.INVALID_TAIL_CHARS:], False, "ambiguous" if found else "no_action_tags")


def parse_action(response: str, cfg: ml_collections.ConfigDict) -> base.ParsedAction:
  """env.answer_format "tags": the shared parse, valid only if the action is one token of the vocabulary;
  "json": parse_json_action."""
  if cfg.answer_format == "json":
    return parse_json_action(response)
  return prompting.restrict(prompting.parse_action(response, cfg.require_think), _token)


JSON_TURN_LINE = (f'{prompting.TURN_LINE_PREFIX}: answer with one JSON object whose "action" is exactly one of the '
                  'admissible actions, e.g. {"thoughts": "...", "action": "3"}.')


def render_prompt(task_description: str, history: Sequence[tuple[str, str]], obs: base.Observation,
                  cfg: ml_collections.ConfigDict) -> str:
  # The image shows the cards and the formula; the formula line is kept as text.
  current = obs.text if cfg.observation == "text" else "<image>\n" + obs.text.splitlines()[-1]
  turn = JSON_TURN_LINE if cfg.answer_format == "json" else ""
  return prompting.render_env_prompt(NAME, task_description, history, current, VOCAB, cfg, turn=turn)


def task_panel(cfg: ml_collections.ConfigDict, split: str) -> list[base.Task]:
  sizes = {"train": (cfg.num_train_tasks, cfg.train_seed_offset), "test": (cfg.num_test_tasks, cfg.test_seed_offset)}
  if split not in sizes:
    raise ValueError(f"ezpoints split must be 'train' or 'test', got {split!r}")
  n, offset = sizes[split]
  tasks = []
  for seed in range(offset, offset + n):
    cards = deal(seed)
    gold = solution([card_value(c) for c in cards])
    tasks.append(base.Task(f"ezpoints-{split}-{seed}", split, NAME, {"seed": seed, "cards": cards},
                           "sum" if gold and gold[1] == "+" else "product"))
  return tasks


def make_env(cfg: ml_collections.ConfigDict) -> EZPointsEnv:
  if cfg.answer_format not in ("tags", "json"):
    raise ValueError(f"ezpoints answer_format must be 'tags' or 'json', got {cfg.answer_format!r}")
  if cfg.observation not in ("text", "image") or (cfg.observation == "image" and not cfg.render_image):
    raise ValueError(f"ezpoints observation must be 'text' or 'image' (which needs render_image=True), got "
                     f"observation={cfg.observation!r}, render_image={cfg.render_image}")
  return EZPointsEnv(cfg)


FAMILY = base.EnvFamily(name=NAME, make_env=make_env, tasks=task_panel, render_prompt=render_prompt,
                        parse_action=parse_action)
