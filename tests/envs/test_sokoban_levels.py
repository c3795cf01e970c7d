"""Sokoban levels: seeded generation, push rules and the BFS solver."""
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
