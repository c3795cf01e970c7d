"""TextWorldExpress (`textworld-express` 1.1.0, a JVM simulator with fast steps): the fast environment for
tests and CPU runs.

Games: coin, cookingworld, twc, mapreader, arithmetic, sorting, simonsays, peckingorder. A game instance is
(game, generation params, seed, fold); the package splits seeds into train/dev/test folds. Reward 10 when
the game reports task success, else 0. The gold action sequence comes from the simulator, except for coin:
there the simulator's gold path is a random walk that changes from one reset of the same game to the next (3 to
27 steps for one 4-room seed), so the coin's gold path is the shortest one, found by a breadth-first search over
rooms (moves in sorted order, each branch replayed from the reset): the same for every reset, process and host.
"""
from __future__ import annotations

import json
import random
from typing import Any, Sequence

from seed_jax.envs import prompting
from seed_jax.envs.base import EnvFamily, Observation, StepResult, Task

GAMES = ("coin", "cookingworld", "twc", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")
# The seed folds of textworld-express 1.1.0 (the same for every game; tests check them against the JVM).
SEED_FOLDS = {"train": range(0, 1000), "dev": range(10000, 11000), "test": range(20000, 21000)}
# Panel split -> seed fold. "train" is every train seed; "dev" and "eval" are fixed samples.
SPLITS = {"train": "train", "dev": "dev", "eval": "test"}


def _games(cfg: Any) -> list[str]:
  games = [g.strip() for g in cfg.games.split(",") if g.strip()]
  bad = [g for g in games if g not in GAMES]
  if not games or bad:
    raise ValueError(f"config.games={cfg.games!r}: unknown or empty game names {bad}; allowed: {GAMES}")
  return games


def task_panel(cfg: Any, split: str) -> list[Task]:
  """Fixed task panel: game-major in `cfg.games` order, seeds ascending. "dev"/"eval" take `eval_per_game`
  seeds per game from the dev/test fold, sampled with a string-seeded RNG (independent of process, host
  and hash seed)."""
  if split not in SPLITS:
    raise ValueError(f"split={split!r}; allowed: {tuple(SPLITS)}")
  fold = SPLITS[split]
  tasks = []
  for game in _games(cfg):
    seeds = list(SEED_FOLDS[fold])
    if split != "train":
      if not 0 < cfg.eval_per_game <= len(seeds):
        raise ValueError(f"config.eval_per_game={cfg.eval_per_game}; allowed: 1..{len(seeds)}")
      seeds = sorted(random.Random(f"twx:{cfg.panel_seed}:{split}:{game}").sample(seeds, cfg.eval_per_game))
    params = cfg.game_params.get(game, "")
    for seed in seeds:
      tasks.append(Task(task_id=f"twx/{game}/{fold}/{seed}", split=split, env="textworld_express",
                        spec={"game": game, "params": params, "seed": seed, "fold": fold}, family=game))
  return tasks


class TWXEnv:
  """One TextWorldExpress simulator (its own JVM)."""

  def __init__(self, cfg: Any):
    from textworld_express import TextWorldExpressEnv  # imported here: workers build envs, drivers need not
    self._sim = TextWorldExpressEnv(envStepLimit=10**9)  # step limits are the rollout's job
    self._server = self._sim.server  # direct calls: the wrapper adds a task-description round trip per step
    self._success_reward = float(cfg.success_reward)
    self._loaded: tuple[str, str] | None = None
    self._gold: list[str] = []
    self._task_description = ""
    self._done = True

  def reset(self, task: Task) -> Observation:
    spec = task.spec
    game, params, seed, fold = spec["game"], spec["params"], int(spec["seed"]), spec["fold"]
    if fold not in SEED_FOLDS or seed not in SEED_FOLDS[fold]:
      raise ValueError(f"task {task.task_id}: seed {seed} is not in fold {fold!r}")
    if self._loaded != (game, params):
      msg = self._server.load(game, params)
      if msg:
        raise ValueError(f"task {task.task_id}: simulator rejected game={game!r} params={params!r}: {msg}")
      self._loaded = (game, params)
    state = json.loads(self._server.generateNewGameJSON(seed, fold, game != "coin"))
    self._gold = list(self._server.getGoldActionSequence()) if game != "coin" else self._shortest_coin_path(seed, fold)
    self._task_description = self._server.getTaskDescription()
    self._done = False
    return self._observation(state)

  def step(self, action: str) -> StepResult:
    if self._done:
      raise RuntimeError("step after the episode ended; reset first")
    state = json.loads(self._server.stepJSON(action))
    success = bool(state["tasksuccess"])
    self._done = success or bool(state["taskfailure"])
    info = {"success": success, "score": float(state["score"]), "failure": bool(state["taskfailure"])}
    return StepResult(self._observation(state), self._success_reward if success else 0.0, self._done, info)

  def gold_actions(self) -> list[str]:
    return list(self._gold)

  def _replay(self, seed: int, fold: str, moves: Sequence[str]) -> dict[str, Any]:
    state = json.loads(self._server.generateNewGameJSON(seed, fold, False))
    for a in moves:
      state = json.loads(self._server.stepJSON(a))
    return state

  def _shortest_coin_path(self, seed: int, fold: str) -> list[str]:
    """"look around", the fewest rooms to the coin's (each closed door opened before it is passed), "take coin"
    (the simulator's gold form); the game is left at its start. [] when no reachable room holds the coin."""
    start = self._replay(seed, fold, [])
    frontier, seen, found = [([], start)], {_room(start)}, None  # (moves, the state they reach)
    while frontier and found is None:
      nxt = []
      for path, state in frontier:
        if "take coin" in state["validActions"]:
          found = path
          break
        valid = set(state["validActions"])
        for move in sorted(a for a in valid if a.startswith("move ")):
          door = f"open door to {move[len('move '):]}"  # a closed door is opened just before passing it
          edge = [door, move] if door in valid else [move]
          reached = self._replay(seed, fold, [*path, *edge])
          if _room(reached) not in seen:
            seen.add(_room(reached))
            nxt.append(([*path, *edge], reached))
      frontier = nxt
    self._replay(seed, fold, [])
    return [] if found is None else ["look around", *found, "take coin"]

  def close(self) -> None:
    self._sim.close()

  def _observation(self, state: dict[str, Any]) -> Observation:
    # Sorted: the simulator lists valid actions in hash order, and G envs must render identical prompts.
    return Observation(text=state["observation"], task_description=self._task_description,
                       admissible=sorted(state["validActions"]))


def _room(state: dict[str, Any]) -> str:
  """The room an observation starts with ("You are in the kitchen. ..." -> "kitchen")."""
  text = state["observation"]
  return text.split("You are in the ", 1)[1].split(".", 1)[0] if "You are in the " in text else text


def make_env(cfg: Any) -> TWXEnv:
  return TWXEnv(cfg)


def render_prompt(task_description: str, history: Sequence[tuple[str, str]], obs: Observation, cfg: Any) -> str:
  return prompting.render_env_prompt("textworld_express", task_description, history, obs.text,
                                     obs.admissible or (), cfg)


parse_action = prompting.parse_env_action


FAMILY = EnvFamily(name="textworld_express", make_env=make_env, tasks=task_panel, render_prompt=render_prompt,
                   parse_action=parse_action)
