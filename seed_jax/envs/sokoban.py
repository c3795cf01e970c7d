"""Sokoban: push every box onto a target, one move (up/down/left/right) per step.

Levels come from sokoban_levels (seeded generation, every level solvable; the gold path is its BFS solver)
or from explicit text rows in Task.spec["rows"]. Rewards follow gym-sokoban's `_calc_reward`: -0.1 per step,
+1 when a box reaches a target, -1 when one leaves it, +10 when all boxes are on targets (which ends the
episode).

Observations are a text grid (legend in the prompt) and an RGB image in Observation.info["image"].
"""
from __future__ import annotations

import functools
import re
from typing import Sequence

import ml_collections
import numpy as np

from seed_jax.envs import base, prompting
from seed_jax.envs.sokoban_levels import ACTIONS, Board, State, generate_level, move, solve, solved

NAME = "sokoban"

# Grid symbols, as in verl-agent's Sokoban text observation.
WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "√", "P", "S"
LEGEND = (f"{WALL} wall, {FLOOR} floor, {TARGET} target, {BOX} box, {BOX_ON_TARGET} box on a target, "
          f"{PLAYER} you (the player), {PLAYER_ON_TARGET} you standing on a target")


def parse_rows(rows: Sequence[str]) -> tuple[Board, State]:
  """A level from text rows of the grid symbols (spaces between symbols are ignored)."""
  rows = [r.replace(" ", "") for r in rows]
  if not rows or len({len(r) for r in rows}) != 1:
    raise ValueError(f"sokoban rows must be equally long and non-empty, got {rows}")
  walls, targets, boxes, players = set(), set(), set(), []
  for i, row in enumerate(rows):
    for j, ch in enumerate(row):
      if ch not in (WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET):
        raise ValueError(f"sokoban rows: unknown symbol {ch!r} at ({i}, {j}); legend: {LEGEND}")
      if ch == WALL:
        walls.add((i, j))
      if ch in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET):
        targets.add((i, j))
      if ch in (BOX, BOX_ON_TARGET):
        boxes.add((i, j))
      if ch in (PLAYER, PLAYER_ON_TARGET):
        players.append((i, j))
  if len(players) != 1 or len(boxes) != len(targets) or not boxes:
    raise ValueError(f"sokoban rows need one player and as many boxes as targets (>0), got {len(players)} "
                     f"player(s), {len(boxes)} box(es), {len(targets)} target(s)")
  return Board((len(rows), len(rows[0])), frozenset(walls), frozenset(targets)), State(players[0], frozenset(boxes))


def render_rows(board: Board, state: State) -> list[str]:
  out = []
  for i in range(board.shape[0]):
    cells = []
    for j in range(board.shape[1]):
      p, on_target = (i, j), (i, j) in board.targets
      if p in board.walls:
        cells.append(WALL)
      elif p in state.boxes:
        cells.append(BOX_ON_TARGET if on_target else BOX)
      elif p == state.player:
        cells.append(PLAYER_ON_TARGET if on_target else PLAYER)
      else:
        cells.append(TARGET if on_target else FLOOR)
    out.append(" ".join(cells))
  return out


# ------------------------------------------------------------------------------------------ image

_COLORS = {"wall": (96, 84, 78), "mortar": (60, 52, 48), "floor": (236, 232, 214), "target": (214, 58, 58),
           "box": (170, 112, 48), "box_edge": (105, 64, 24), "box_done": (82, 160, 72), "player": (48, 96, 214)}


@functools.lru_cache(maxsize=8)
def _tiles(t: int) -> dict[str, np.ndarray]:
  yy, xx = np.mgrid[0:t, 0:t]
  floor = np.empty((t, t, 3), np.uint8)
  floor[:] = _COLORS["floor"]
  wall = np.empty_like(floor)
  wall[:] = _COLORS["wall"]
  wall[(yy % (t // 2) == 0) | ((xx + (yy >= t // 2) * (t // 2)) % t == 0)] = _COLORS["mortar"]  # brick joints
  ring = (np.maximum(abs(yy - (t - 1) / 2), abs(xx - (t - 1) / 2)) >= t / 2 - 4) & (
      np.maximum(abs(yy - (t - 1) / 2), abs(xx - (t - 1) / 2)) < t / 2 - 2)
  target = floor.copy()
  target[ring] = _COLORS["target"]

  def box(color: tuple[int, int, int]) -> np.ndarray:
    img = floor.copy()
    inner = (yy >= 1) & (yy < t - 1) & (xx >= 1) & (xx < t - 1)
    img[inner] = _COLORS["box_edge"]
    core = (yy >= 3) & (yy < t - 3) & (xx >= 3) & (xx < t - 3)
    img[core & (yy != xx) & (yy != t - 1 - xx)] = color  # a crate with a diagonal cross
    return img

  disc = (yy - (t - 1) / 2) ** 2 + (xx - (t - 1) / 2) ** 2 <= (t / 2 - 3) ** 2
  player, player_on_target = floor.copy(), target.copy()
  player[disc] = _COLORS["player"]
  player_on_target[disc] = _COLORS["player"]
  return {WALL: wall, FLOOR: floor, TARGET: target, BOX: box(_COLORS["box"]), BOX_ON_TARGET: box(_COLORS["box_done"]),
          PLAYER: player, PLAYER_ON_TARGET: player_on_target}


def render_image(board: Board, state: State, tile_px: int = 16) -> np.ndarray:
  """uint8 [rows * tile_px, cols * tile_px, 3] picture of the level."""
  tiles = _tiles(tile_px)
  grid = [row.split(" ") for row in render_rows(board, state)]
  return np.concatenate([np.concatenate([tiles[c] for c in row], axis=1) for row in grid], axis=0)


# ------------------------------------------------------------------------------------------ env


class SokobanEnv:

  def __init__(self, cfg: ml_collections.ConfigDict):
    self.cfg = cfg
    self._board: Board | None = None
    self._state: State | None = None
    self._start: State | None = None
    self._steps, self._done, self._task_description = 0, True, ""

  def reset(self, task: base.Task) -> base.Observation:
    spec = task.spec
    if "rows" in spec:
      self._board, self._state = parse_rows(spec["rows"])
    else:
      self._board, self._state = generate_level(int(spec["seed"]), tuple(spec["dim_room"]), int(spec["num_boxes"]),
                                                int(spec["search_depth"]), int(spec["walk_steps"]),
                                                float(spec["p_change_directions"]), int(spec.get("player_walk", 0)))
    self._start, self._steps, self._done = self._state, 0, False
    n = len(self._board.targets)
    self._task_description = f"push the {'box' if n == 1 else f'{n} boxes'} onto the target{'s' * (n > 1)}."
    return self._observation()

  def _observation(self) -> base.Observation:
    assert self._board is not None and self._state is not None
    text = "\n".join(render_rows(self._board, self._state))
    info = {"image": render_image(self._board, self._state, self.cfg.tile_px)} if self.cfg.render_image else {}
    return base.Observation(text, self._task_description, list(ACTIONS), info)

  def step(self, action: str) -> base.StepResult:
    if self._board is None or self._state is None or self._done:
      raise ValueError("SokobanEnv.step called before reset or after the episode ended")
    act = action.strip().lower()
    before = self._state
    if act in ACTIONS:
      self._state = move(self._board, before, act)
    on_before = len(before.boxes & self._board.targets)
    on_after = len(self._state.boxes & self._board.targets)
    reward = self.cfg.step_penalty
    if on_after > on_before:
      reward += self.cfg.box_on_target_reward
    elif on_after < on_before:
      reward += self.cfg.box_off_target_penalty
    success = solved(self._board, self._state)
    if success:
      reward += self.cfg.finish_reward
    self._steps += 1
    truncated = not success and self._steps >= self.cfg.max_steps
    self._done = success or truncated
    info = {"success": success, "score": on_after / len(self._board.targets), "boxes_on_target": on_after,
            "moved": self._state != before, "invalid_action": act not in ACTIONS, "truncated": truncated}
    return base.StepResult(self._observation(), float(reward), self._done, info)

  def gold_actions(self) -> list[str] | None:
    """A shortest solution from the reset state."""
    if self._board is None or self._start is None:
      return None
    return solve(self._board, self._start, self.cfg.solver_max_states)

  def close(self) -> None:
    pass


# ------------------------------------------------------------------------------------------ prompts and actions

def _direction(text: str) -> str | None:
  """The one direction an action text names ("up", "move up."), else None."""
  words = set(re.findall(r"[a-z]+", text)) & set(ACTIONS)
  return words.pop() if len(words) == 1 else None


def parse_action(response: str, cfg: ml_collections.ConfigDict) -> base.ParsedAction:
  """The shared parse, then valid only if the action names exactly one of up/down/left/right."""
  return prompting.restrict(prompting.parse_action(response, cfg.require_think), _direction)


def render_prompt(task_description: str, history: Sequence[tuple[str, str]], obs: base.Observation,
                  cfg: ml_collections.ConfigDict) -> str:
  image = cfg.observation == "image"  # the reference's visual prompt has no text legend
  return prompting.render_env_prompt(NAME, task_description, history, "<image>" if image else obs.text, ACTIONS, cfg,
                                     legend="" if image else f"Symbols: {LEGEND}.")  # {legend}: the grid's key


def task_panel(cfg: ml_collections.ConfigDict, split: str) -> list[base.Task]:
  sizes = {"train": (cfg.num_train_tasks, cfg.train_seed_offset), "test": (cfg.num_test_tasks, cfg.test_seed_offset)}
  if split not in sizes:
    raise ValueError(f"sokoban split must be 'train' or 'test', got {split!r}")
  n, offset = sizes[split]
  dim = [int(x) for x in cfg.dim_room]
  family = f"{dim[0]}x{dim[1]}-{cfg.num_boxes}box"
  return [base.Task(f"sokoban-{split}-{offset + i}", split, NAME,
                    {"seed": offset + i, "dim_room": dim, "num_boxes": cfg.num_boxes, "search_depth": cfg.search_depth,
                     "walk_steps": cfg.walk_steps, "p_change_directions": cfg.p_change_directions,
                     "player_walk": cfg.player_walk}, family)
          for i in range(n)]


def make_env(cfg: ml_collections.ConfigDict) -> SokobanEnv:
  if cfg.observation not in ("text", "image") or (cfg.observation == "image" and not cfg.render_image):
    raise ValueError(f"sokoban observation must be 'text' or 'image' (which needs render_image=True), got "
                     f"observation={cfg.observation!r}, render_image={cfg.render_image}")
  return SokobanEnv(cfg)


FAMILY = base.EnvFamily(name=NAME, make_env=make_env, tasks=task_panel, render_prompt=render_prompt,
                        parse_action=parse_action)
