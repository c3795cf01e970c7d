"""ALFWorld (text). Variants: "" = CPU-sized (a few short episodes with the embedded model); "paper" = SEED's
settings (SEED_ALGORITHM.md §5).

Needs the official game files: --config.env.data_dir=/folder/holding/json_2.1.1 ("" = $ALFWORLD_DATA, else
~/.cache/alfworld, where `alfworld-download` puts them).
"""
from configs import base
from configs.sciworld import cpu_default, paper_default
from seed_jax.envs import alfworld


def get_config(variant: str = ""):
  c = base.get_base()
  c.env = alfworld.default_config()
  c.env.name = "alfworld"
  c.env.train_split = "train"
  c.eval.split = "valid_seen,valid_unseen"  # seen 140 / unseen 134 games with the official data
  if variant == "":
    cpu_default(c)
  elif variant == "paper":
    paper_default(c)
    c.rollout.tasks_per_update, c.rollout.group_size = 16, 8
    c.env.max_steps, c.env.history_length = 30, 5
  else:
    raise ValueError(f"unknown variant {variant!r} of configs/alfworld.py; known: '', 'paper'")
  return c
