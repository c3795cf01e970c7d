"""Sokoban levels: seeded generation, push rules and the BFS solver."""
import numpy as np
import pytest

from seed_jax.envs import sokoban, sokoban_levels


def test_same_seed_same_level_and_seeds_differ():
  levels = [sokoban.render_rows(*sokoban_levels.generate_level(seed)) for seed in range(20)]
  assert levels == [sokoban.render_rows(*sokoban_levels.generate_level(seed)) for seed in range(20)]
  assert len({tuple(lv) for lv in levels}) >= 15
  assert sokoban.render_rows(*sokoban_levels.generate_level(3)) == [
      "# # # # # #",
      "# # _ _ _ #",
      "# # _ _ O #",
      "# # _ X # #",
      "# # _ P _ #",
      "# # # # # #"]


def test_larger_rooms_and_more_boxes_are_solvable():
  for seed in range(10):
    board, state = sokoban_levels.generate_level(seed, (8, 8), 2, search_depth=12, walk_steps=27)
    assert len(state.boxes) == 2 and not state.boxes & board.targets
    path = sokoban_levels.solve(board, state)
    assert path is not None and len(path) <= 12
    for a in path:
      state = sokoban_levels.move(board, state, a)
    assert sokoban_levels.solved(board, state)
  with pytest.raises(ValueError, match="num_boxes"):
    sokoban_levels.generate_level(0, (6, 6), 0)


def test_the_player_walk_after_generation_over_1000_seeds():
  """The reference's random player move: the board and boxes stay as generated; in about half of the levels the
  player walks 1-3 free cells away (each step with probability 1/2 after the first), so it no longer always
  starts beside the box; every level stays solvable within search_depth + 3 moves."""
  n, moved, movable, beside, lengths = 1000, 0, 0, 0, {0: [], 3: []}
  for seed in range(n):
    board, still = sokoban_levels.generate_level(seed)
    board3, walked = sokoban_levels.generate_level(seed, player_walk=3)
    assert board3 == board and walked.boxes == still.boxes
    dist = abs(walked.player[0] - still.player[0]) + abs(walked.player[1] - still.player[1])
    assert dist <= 3 and not board.blocked(walked.player) and walked.player not in walked.boxes
    moved += walked.player != still.player
    movable += any(not board.blocked(q) and q not in still.boxes for q in (
        (still.player[0] + dr, still.player[1] + dc) for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))))
    beside += any(abs(walked.player[0] - r) + abs(walked.player[1] - c) == 1 for r, c in walked.boxes)
    assert any(abs(still.player[0] - r) + abs(still.player[1] - c) == 1 for r, c in still.boxes)
    for walk, state in ((0, still), (3, walked)):
      path = sokoban_levels.solve(board, state)
      assert path is not None and len(path) <= 15 + walk
      lengths[walk].append(len(path))
  assert abs(moved / movable - 0.5) < 0.05  # P(move) = 1/2 where a free cell is next to it; 3 sigma < 0.05
  assert 0.5 < beside / n < 0.8  # measured 0.639: 1.0 without the walk
  assert np.mean(lengths[3]) > np.mean(lengths[0]) + 0.3  # measured 3.85 vs 3.15 moves
