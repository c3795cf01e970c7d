"""EZPoints (two cards, make 12). Variants: "" = CPU-sized; "paper" = SEED's settings (docs/algorithm.md §5).

The paper's policy is a vision model. The text variants read text, so the cards are named in text (the env's
RGB rendering is turned off) and no history is shown, as in the paper. A solution takes 4 steps.
"vl" / "paper,vl" = the vision-language policy seeing the RGB frame (configs/vl.py).
"collect" / "annotate" / "sft" / "warmstart" (+ ",paper") = Stage 1 (configs/stage1.py).
"""
import ml_collections

from configs import base, variants


def get_config(variant: str = ""):
  """variant: names of VARIANTS (configs/variants.py), e.g. "", "paper", "paper,vl", "sft,paper"."""
  return variants.build(variant, "ezpoints", base.text_game("ezpoints", env_config()), base.text_game_cpu, VARIANTS)


def paper(c, _=True) -> None:
  """The reference's EZPoints settings (its launcher runs 100 updates)."""
  base.text_game_paper(c, tasks_per_update=16, max_steps=8)
  c.learner.minibatch_size = 128
  c.model.max_prompt_tokens = 1024
  c.train.num_updates = 100
  c.env.answer_format = "json"  # the reference's policy answers {"action": ...}, read as gym-cards reads it
  c.analyzer.external.json_retry = True  # the JSON-retry turn, as for WebShop and Sokoban


VARIANTS = {variants.PAPER: paper, **variants.STAGES, **variants.VL}


def env_config() -> ml_collections.ConfigDict:
  """The environment's own defaults (config.env before the variant's overrides; `name` is set by get_config)."""
  c = ml_collections.ConfigDict()
  c.max_steps = 8  # tokens per episode; the env ends the episode there (info["truncated"])
  c.success_reward = 10.0  # reward when "=" evaluates to 12 with both cards used
  c.require_think = True  # a response without <think>...</think> is invalid (answer_format "tags" only)
  # "tags": <think>...</think><action>3</action>; "json": {"action": "3"} read as gym-cards reads it (the reference)
  c.answer_format = "tags"
  c.history_length = 0  # past (observation, action) pairs in the prompt (SEED's EZPoints setting uses none)
  c.history_obs_chars = 0  # past observations in the prompt are clipped to this many characters (0 = no limit)
  c.observation = "text"  # "text": the cards are named in the prompt; "image": an <image> placeholder
  c.render_image = True  # put the RGB array in Observation.info["image"] (off saves work for text-only runs)
  c.num_train_tasks = 10_000  # panel sizes; task i of a split deals from seed offset + i
  c.num_test_tasks = 128
  c.train_seed_offset = 0
  c.test_seed_offset = 1_000_000
  c.step_timeout_s = 10.0  # pool deadline of one step
  c.reset_timeout_s = 30.0  # pool deadline of one reset
  c.start_timeout_s = 60.0  # extra time for a fresh worker to start
  return c
