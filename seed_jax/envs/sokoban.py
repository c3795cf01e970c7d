"""Sokoban: push every box onto a target, one move (up/down/left/right) per step.

Levels are generated reproducibly from a seed as in gym-sokoban's `generate_room`: a random walk carves the
floor, the boxes start on their targets, and play runs backwards (the player walks and pulls boxes); the
reachable reverse state that displaces the boxes most becomes the level, so every level is solvable. Here the
reverse search is breadth-first and limited to `search_depth` moves, so each level is also solvable in at
most `search_depth` pushes-and-walks. Rewards follow gym-sokoban's `_calc_reward`: -0.1 per step, +1 when a
box reaches a target, -1 when one leaves it, +10 when all boxes are on targets (which ends the episode).

Observations are a text grid (legend in the prompt) and an RGB image in Observation.info["image"].
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import random
import re
from typing import Sequence

import ml_collections
import numpy as np

from seed_jax.envs import base, prompting

NAME = "sokoban"
ACTIONS = ("up", "down", "left", "right")
_DELTA = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
Pos = tuple[int, int]

# Grid symbols, as in verl-agent's Sokoban text observation.
WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "√", "P", "S"
LEGEND = (f"{WALL} wall, {FLOOR} floor, {TARGET} target, {BOX} box, {BOX_ON_TARGET} box on a target, "
          f"{PLAYER} you (the player), {PLAYER_ON_TARGET} you standing on a target")


@dataclasses.dataclass(frozen=True)
class Board:
  """The fixed part of a level; cells outside the grid count as walls."""
  shape: tuple[int, int]
  walls: frozenset[Pos]
  targets: frozenset[Pos]

  def blocked(self, p: Pos) -> bool:
    return p in self.walls or not (0 <= p[0] < self.shape[0] and 0 <= p[1] < self.shape[1])


@dataclasses.dataclass(frozen=True)
class State:
  player: Pos
  boxes: frozenset[Pos]


def _add(p: Pos, d: Pos, k: int = 1) -> Pos:
  return (p[0] + k * d[0], p[1] + k * d[1])


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


def move(board: Board, state: State, action: str) -> State:
  """gym-sokoban's push action: walk one cell, pushing a box if the cell behind it is free; a move into a
  wall, or into a box backed by a wall or another box, leaves the state unchanged."""
  d = _DELTA[action]
  nxt = _add(state.player, d)
  if board.blocked(nxt):
    return state
  if nxt in state.boxes:
    beyond = _add(nxt, d)
    if board.blocked(beyond) or beyond in state.boxes:
      return state
    return State(nxt, (state.boxes - {nxt}) | {beyond})
  return State(nxt, state.boxes)


def solved(board: Board, state: State) -> bool:
  return state.boxes == board.targets


def solve(board: Board, state: State, max_states: int = 200_000) -> list[str] | None:
  """A shortest action sequence that solves the level (BFS over player and box positions), or None."""
  if solved(board, state):
    return []
  parent: dict[State, tuple[State, str] | None] = {state: None}
  queue = collections.deque([state])
  while queue and len(parent) < max_states:
    s = queue.popleft()
    for a in ACTIONS:
      n = move(board, s, a)
      if n in parent:
        continue
      parent[n] = (s, a)
      if solved(board, n):
        path = []
        while parent[n] is not None:
          n, a = parent[n]
          path.append(a)
        return path[::-1]
      queue.append(n)
  return None


# ------------------------------------------------------------------------------------------ generation

# Floor stamps of gym-sokoban's room_topology_generation, centred on the random-walk position.
_MASKS = (((0, 0, 0), (1, 1, 1), (0, 0, 0)), ((0, 1, 0), (0, 1, 0), (0, 1, 0)), ((0, 0, 0), (1, 1, 0), (0, 1, 0)),
          ((0, 0, 0), (1, 1, 0), (1, 1, 0)), ((0, 0, 0), (0, 1, 1), (0, 1, 0)))


def _carve_floor(rng: random.Random, dim: tuple[int, int], walk_steps: int, p_change: float) -> list[Pos]:
  h, w = dim
  floor = np.zeros(dim, bool)
  dirs = list(_DELTA.values())
  d = rng.choice(dirs)
  pos = (rng.randint(1, h - 2), rng.randint(1, w - 2))
  for _ in range(walk_steps):
    if rng.random() < p_change:
      d = rng.choice(dirs)
    pos = (min(max(pos[0] + d[0], 1), h - 2), min(max(pos[1] + d[1], 1), w - 2))
    floor[pos[0] - 1:pos[0] + 2, pos[1] - 1:pos[1] + 2] |= np.asarray(rng.choice(_MASKS), bool)
  floor[[0, h - 1], :] = False
  floor[:, [0, w - 1]] = False
  return [tuple(map(int, p)) for p in np.argwhere(floor)]


def _reverse_play(board: Board, player: Pos, depth: int) -> State | None:
  """Plays backwards from the solved state (walk, or walk while pulling the box behind) for `depth` moves,
  breadth-first; returns the first reached state with the best score among states with no box on a target
  (None if all score 0). Score = pulls x total box displacement from the box's own target: gym-sokoban's
  box_swaps x box_displacement_score as its recursion actually counts swaps (it passes the previous
  last_pull down, so every pull counts)."""
  targets = tuple(sorted(board.targets))
  start = (player, targets, 0)  # player, box i's position (box i starts on target i), pulls so far
  seen = {(player, frozenset(targets))}
  frontier, best, best_score = [start], None, 0
  for _ in range(depth):
    nxt_frontier = []
    for p, boxes, pulls in frontier:
      for d in _DELTA.values():
        q = _add(p, d)
        if board.blocked(q) or q in boxes:
          continue
        behind = _add(p, d, -1)
        options = [(q, boxes, pulls)]
        if behind in boxes:
          k = boxes.index(behind)
          options.append((q, boxes[:k] + (p,) + boxes[k + 1:], pulls + 1))
        for s in options:
          key = (s[0], frozenset(s[1]))
          if key in seen:
            continue
          seen.add(key)
          nxt_frontier.append(s)
          if not board.targets & set(s[1]):
            score = s[2] * sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(s[1], targets))
            if score > best_score:
              best, best_score = State(s[0], frozenset(s[1])), score
    frontier = nxt_frontier
  return best


def generate_level(seed: int, dim: tuple[int, int] = (6, 6), num_boxes: int = 1, search_depth: int = 15,
                   walk_steps: int = 20, p_change_directions: float = 0.35,
                   max_tries: int = 200) -> tuple[Board, State]:
  """A solvable level, identical for identical arguments on every platform."""
  if dim[0] < 3 or dim[1] < 3 or num_boxes < 1 or search_depth < 1:
    raise ValueError(f"sokoban generation: need dim >= 3x3, num_boxes >= 1, search_depth >= 1; got dim={dim}, "
                     f"num_boxes={num_boxes}, search_depth={search_depth}")
  rng = random.Random(seed)
  walls_all = {(i, j) for i in range(dim[0]) for j in range(dim[1])}
  for _ in range(max_tries):
    floor = _carve_floor(rng, dim, walk_steps, p_change_directions)
    if len(floor) < num_boxes + 2:
      continue
    player = rng.choice(floor)
    targets = rng.sample([p for p in floor if p != player], num_boxes)
    board = Board(dim, frozenset(walls_all - set(floor)), frozenset(targets))
    state = _reverse_play(board, player, search_depth)
    if state is not None:
      return board, state
  raise RuntimeError(f"sokoban: no level with a displaced box after {max_tries} tries (seed={seed}, dim={dim}, "
                     f"num_boxes={num_boxes}, search_depth={search_depth})")


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
                                                float(spec["p_change_directions"]))
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
    if act in _DELTA:
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
            "moved": self._state != before, "invalid_action": act not in _DELTA, "truncated": truncated}
    return base.StepResult(self._observation(), float(reward), self._done, info)

  def gold_actions(self) -> list[str] | None:
    """A shortest solution from the reset state."""
    if self._board is None or self._start is None:
      return None
    return solve(self._board, self._start, self.cfg.solver_max_states)

  def close(self) -> None:
    pass


# ------------------------------------------------------------------------------------------ prompts and actions

INTRO = ("You are an expert Sokoban player.\n"
         "Rules: each move goes up, down, left or right by one cell. Walking into a box pushes it one cell if the "
         "cell behind it is free; you cannot pull boxes, push two boxes at once, or walk through walls. Do not push "
         "a box into a corner or along a wall where it can no longer reach a target.")


def _direction(text: str) -> str | None:
  """The one direction an action text names ("up", "move up."), else None."""
  words = set(re.findall(r"[a-z]+", text)) & set(ACTIONS)
  return words.pop() if len(words) == 1 else None


def parse_sokoban_action(response: str, require_think: bool = True) -> base.ParsedAction:
  """The shared parse, then valid only if the action names exactly one of up/down/left/right."""
  return prompting.restrict(prompting.parse_action(response, require_think), _direction)


def render_sokoban_prompt(task_description: str, history: Sequence[tuple[str, str]], obs: base.Observation,
                          cfg: ml_collections.ConfigDict) -> str:
  return prompting.render_step_prompt(
      intro=INTRO, task_description=task_description, history=history,
      observation="<image>" if cfg.observation == "image" else obs.text,
      choices=[f"Symbols: {LEGEND}.", f"Your admissible actions: {', '.join(ACTIONS)}"],
      history_length=cfg.history_length, require_think=cfg.require_think,
      history_obs_chars=cfg.history_obs_chars)


def build_tasks(cfg: ml_collections.ConfigDict, split: str) -> list[base.Task]:
  sizes = {"train": (cfg.num_train_tasks, cfg.train_seed_offset), "test": (cfg.num_test_tasks, cfg.test_seed_offset)}
  if split not in sizes:
    raise ValueError(f"sokoban split must be 'train' or 'test', got {split!r}")
  n, offset = sizes[split]
  dim = [int(x) for x in cfg.dim_room]
  family = f"{dim[0]}x{dim[1]}-{cfg.num_boxes}box"
  return [base.Task(f"sokoban-{split}-{offset + i}", split, NAME,
                    {"seed": offset + i, "dim_room": dim, "num_boxes": cfg.num_boxes, "search_depth": cfg.search_depth,
                     "walk_steps": cfg.walk_steps, "p_change_directions": cfg.p_change_directions}, family)
          for i in range(n)]


class SokobanFamily:
  """The Sokoban EnvFamily; `cfg` everywhere is this module's default_config() shape."""
  name = NAME

  def make_env(self, cfg: ml_collections.ConfigDict) -> SokobanEnv:
    if cfg.observation not in ("text", "image") or (cfg.observation == "image" and not cfg.render_image):
      raise ValueError(f"sokoban observation must be 'text' or 'image' (which needs render_image=True), got "
                       f"observation={cfg.observation!r}, render_image={cfg.render_image}")
    return SokobanEnv(cfg)

  def tasks(self, cfg: ml_collections.ConfigDict, split: str) -> list[base.Task]:
    return build_tasks(cfg, split)

  def render_prompt(self, task_description: str, history: Sequence[tuple[str, str]], obs: base.Observation,
                    cfg: ml_collections.ConfigDict) -> str:
    return render_sokoban_prompt(task_description, history, obs, cfg)

  def parse_action(self, response: str, cfg: ml_collections.ConfigDict) -> base.ParsedAction:
    return parse_sokoban_action(response, cfg.require_think)


FAMILY = SokobanFamily()
