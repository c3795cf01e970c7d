"""Sokoban levels: the board and push rules, a shortest-path solver and a seeded level generator.

Levels are generated reproducibly from a seed as in gym-sokoban's `generate_room`: a random walk carves the
floor, the boxes start on their targets, and play runs backwards (the player walks and pulls boxes); the
reachable reverse state that displaces the boxes most becomes the level, so every level is solvable. Here the
reverse search is breadth-first and limited to `search_depth` moves, so each level is also solvable in at
most `search_depth` pushes-and-walks. With `player_walk` > 0 the player then walks away at random, as the
reference's generator does (otherwise it always starts beside a box): with probability 1/2 it takes up to
`player_walk` steps onto free, unvisited cells, going on after each with probability 1/2 (the solution grows by
at most those steps, since they can be walked back).
"""
from __future__ import annotations

import collections
import dataclasses
import random

import numpy as np

# The order matters: it is the solver's BFS order and the generator's direction choices.
ACTIONS = ("up", "down", "left", "right")
_DELTA = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
Pos = tuple[int, int]


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


def _walk_player(rng: random.Random, board: Board, state: State, max_steps: int) -> State:
  """The reference's random player move after reverse play (see the module docstring)."""
  if not max_steps or rng.random() > 0.5:
    return state
  p, visited = state.player, {state.player}
  for _ in range(max_steps):
    free = [q for q in (_add(p, d) for d in _DELTA.values())
            if not board.blocked(q) and q not in state.boxes and q not in visited]
    if not free:
      break
    p = rng.choice(free)
    visited.add(p)
    if rng.random() > 0.5:  # go on with probability 1/2
      break
  return State(p, state.boxes)


def generate_level(seed: int, dim: tuple[int, int] = (6, 6), num_boxes: int = 1, search_depth: int = 15,
                   walk_steps: int = 20, p_change_directions: float = 0.35, player_walk: int = 0,
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
      return board, _walk_player(rng, board, state, player_walk)
  raise RuntimeError(f"sokoban: no level with a displaced box after {max_tries} tries (seed={seed}, dim={dim}, "
                     f"num_boxes={num_boxes}, search_depth={search_depth})")
