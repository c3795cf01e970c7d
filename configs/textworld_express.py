"""TextWorldExpress: the fast JVM environment for tests, demos and CPU-scale experiments.

Variants: "" = CPU-sized (coin, 2 rooms); "paper" = SEED's batch/group sizes and update settings.
"""
from configs import base
from configs.sciworld import cpu_default, paper_default
from seed_jax.envs import textworld_express


def get_config(variant: str = ""):
  c = base.get_base()
  c.env = textworld_express.default_config()
  c.env.name = "textworld_express"
  c.env.train_split = "train"
  c.eval.split = "eval"
  if variant == "":
    cpu_default(c)
  elif variant == "paper":
    paper_default(c)
    c.env.max_steps, c.env.history_length = 30, 5
  else:
    raise ValueError(f"unknown variant {variant!r} of configs/textworld_express.py; known: '', 'paper'")
  return c
