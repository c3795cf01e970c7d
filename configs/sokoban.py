"""Sokoban 6x6, one box. Variants: "" = CPU-sized; "paper" = SEED's settings (docs/algorithm.md §5).

The paper's policy is a vision model. The text variants read text, so the grid is shown as text (the env's RGB
rendering is turned off) and no history is shown, as in the paper.
"vl" / "paper,vl" = the vision-language policy seeing the RGB frame (configs/vl.py).
"collect" / "annotate" / "sft" / "warmstart" (+ ",paper") = Stage 1 (configs/stage1.py).
"""
import ml_collections

from configs import base, variants


def get_config(variant: str = ""):
  """variant: names of VARIANTS (configs/variants.py), e.g. "", "paper", "paper,vl", "sft,paper"."""
  return variants.build(variant, "sokoban", base.text_game("sokoban", env_config()), base.text_game_cpu, VARIANTS)


def paper(c, _=True) -> None:
  """The reference's Sokoban settings."""
  base.text_game_paper(c, tasks_per_update=32, max_steps=15)
  c.learner.minibatch_size = 64
  c.model.max_prompt_tokens = 1024
  c.env.search_depth = 30
  c.env.player_walk = 3  # the reference's random player move after generation
  c.analyzer.external.json_retry = True


VARIANTS = {variants.PAPER: paper, **variants.STAGES, **variants.VL}


def env_config() -> ml_collections.ConfigDict:
  """The environment's own defaults (config.env before the variant's overrides; `name` is set by get_config)."""
  c = ml_collections.ConfigDict()
  c.dim_room = (6, 6)  # rows, columns, outer walls included
  c.num_boxes = 1
  c.max_steps = 15  # moves per episode; the env ends the episode there (info["truncated"])
  c.search_depth = 15  # reverse-play moves explored when generating; bounds the solution length
  c.walk_steps = 20  # random-walk steps carving the floor (gym-sokoban: 1.7 x (rows + columns))
  c.p_change_directions = 0.35  # chance per walk step of turning
  c.player_walk = 0  # after generation the player walks up to this many random steps away (the reference: 3)
  c.step_penalty = -0.1  # gym-sokoban penalty_for_step
  c.box_on_target_reward = 1.0  # gym-sokoban reward_box_on_target
  c.box_off_target_penalty = -1.0  # gym-sokoban penalty_box_off_target
  c.finish_reward = 10.0  # gym-sokoban reward_finished
  c.require_think = True  # a response without <think>...</think> is invalid
  c.history_length = 0  # past (observation, action) pairs in the prompt (SEED's Sokoban setting uses none)
  c.history_obs_chars = 0  # past observations in the prompt are clipped to this many characters (0 = no limit)
  c.observation = "text"  # "text": the grid goes in the prompt; "image": an <image> placeholder does
  c.render_image = True  # put the RGB array in Observation.info["image"] (off saves work for text-only runs)
  c.tile_px = 16  # pixels per cell of the RGB observation
  c.solver_max_states = 200_000  # BFS budget of the gold-path solver
  c.num_train_tasks = 10_000  # panel sizes; task i of a split uses seed offset + i
  c.num_test_tasks = 128
  c.train_seed_offset = 0
  c.test_seed_offset = 1_000_000
  c.step_timeout_s = 10.0  # pool deadline of one step
  c.reset_timeout_s = 60.0  # pool deadline of one reset (level generation) or gold path (BFS solver)
  c.start_timeout_s = 60.0  # extra time for a fresh worker to start
  return c
