"""WebShop (text). Variants: "" = CPU-sized; "paper" = SEED's settings (SEED_ALGORITHM.md §5).

Needs the official data files: --config.env.data_dir=/folder/with/items_shuffle_1000.json,... ("" =
$WEBSHOP_DATA_ROOT). Both variants use WebShop's advantage normalization, mean_norm (s - mu).
"""
from configs import base
from configs.sciworld import cpu_default, paper_default
from seed_jax.envs import webshop


def get_config(variant: str = ""):
  c = base.get_base()
  c.env = webshop.default_config()
  c.env.name = "webshop"
  c.env.train_split = "train"
  c.eval.split = "test"  # the first env.num_test_goals goals (paper: 500)
  c.objectives.norm_mode = "mean_norm"
  if variant == "":
    cpu_default(c)
  elif variant == "paper":
    paper_default(c)
    c.rollout.tasks_per_update, c.rollout.group_size = 16, 8
    c.env.max_steps, c.env.history_length = 15, 2
  else:
    raise ValueError(f"unknown variant {variant!r} of configs/webshop.py; known: '', 'paper'")
  return c
