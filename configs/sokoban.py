"""Sokoban 6x6, one box. Variants: "" = CPU-sized; "paper" = SEED's settings (SEED_ALGORITHM.md §5).

The paper's policy is a vision model; the policies here read text, so the grid is shown as text (the env's RGB
rendering is turned off) and no history is shown, as in the paper.
"""
from configs import base
from configs.sciworld import cpu_default, paper_default
from seed_jax.envs import sokoban


def get_config(variant: str = ""):
  c = base.get_base()
  c.env = sokoban.default_config()
  c.env.name = "sokoban"
  c.env.train_split = "train"
  c.eval.split = "test"
  c.env.observation, c.env.render_image = "text", False
  if variant == "":
    cpu_default(c)
    c.env.history_length = 0
  elif variant == "paper":
    paper_default(c)
    c.rollout.tasks_per_update, c.rollout.group_size = 32, 8
    c.env.max_steps, c.env.history_length = 15, 0
  else:
    raise ValueError(f"unknown variant {variant!r} of configs/sokoban.py; known: '', 'paper'")
  return c
