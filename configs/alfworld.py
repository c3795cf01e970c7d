"""ALFWorld (text). Variants: "" = CPU-sized (a few short episodes with the embedded model); "paper" = SEED's
settings (docs/algorithm.md §5).

Needs the official game files: --config.env.data_dir=/folder/holding/json_2.1.1 ("" = $ALFWORLD_DATA, else
~/.cache/alfworld, where `alfworld-download` puts them).
"collect" / "annotate" / "sft" / "warmstart" (+ ",paper") = Stage 1 (configs/stage1.py).
"""
import ml_collections

from configs import base, variants


def get_config(variant: str = ""):
  """variant: names of VARIANTS (configs/variants.py), e.g. "", "paper", "sft,paper"."""
  c = base.get_base()
  c.env = env_config()
  c.env.name = "alfworld"
  c.env.train_split = "train"
  c.eval.split = "valid_seen,valid_unseen"  # seen 140 / unseen 134 games with the official data
  return variants.build(variant, "alfworld", c, base.cpu_default, VARIANTS)


def paper(c, _=True) -> None:
  base.paper_default(c)
  c.rollout.tasks_per_update, c.rollout.group_size = 16, 8
  c.env.max_steps, c.env.history_length = 30, 5
  c.model.max_prompt_tokens = 2048  # the reference's ALFWorld prompt limit
  c.templates.action_list = "quoted_lines"  # the reference's action list


VARIANTS = {variants.PAPER: paper, **variants.STAGES}


def env_config() -> ml_collections.ConfigDict:
  """The environment's own defaults (config.env before the variant's overrides; `name` is set by get_config)."""
  c = ml_collections.ConfigDict()
  # Folder holding json_2.1.1/. "" means $ALFWORLD_DATA, else ~/.cache/alfworld (alfworld-download's default).
  c.data_dir = ""
  # Episode cap (SEED paper: 30 steps); the rollout loop enforces it.
  c.max_steps = 30
  # Number of past (observation, action) pairs shown in each step prompt (SEED paper: 5).
  c.history_length = 5
  # Past observations in the prompt are clipped to this many characters (0 = no limit).
  c.history_obs_chars = 0
  # An answer without <think>...</think> is an invalid action.
  c.require_think = True
  # Pool deadlines: one step; one reset (loading a game file); a fresh worker importing the engine.
  c.step_timeout_s = 30.0
  c.reset_timeout_s = 120.0
  c.start_timeout_s = 120.0
  return c
