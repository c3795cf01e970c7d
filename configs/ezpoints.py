"""EZPoints (two cards, make 12). Variants: "" = CPU-sized; "paper" = SEED's settings (SEED_ALGORITHM.md §5).

The paper's policy is a vision model; the policies here read text, so the cards are named in text (the env's
RGB rendering is turned off) and no history is shown, as in the paper. A solution takes 4 steps.
"""
from configs import base
from configs.sciworld import cpu_default, paper_default
from seed_jax.envs import ezpoints


def get_config(variant: str = ""):
  c = base.get_base()
  c.env = ezpoints.default_config()
  c.env.name = "ezpoints"
  c.env.train_split = "train"
  c.eval.split = "test"
  c.env.observation, c.env.render_image = "text", False
  if variant == "":
    cpu_default(c)
    c.env.history_length = 0
  elif variant == "paper":
    paper_default(c)
    c.rollout.tasks_per_update, c.rollout.group_size = 16, 8
    c.env.max_steps, c.env.history_length = 8, 0
  else:
    raise ValueError(f"unknown variant {variant!r} of configs/ezpoints.py; known: '', 'paper'")
  return c
