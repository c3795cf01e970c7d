"""TextWorldExpress: the fast JVM environment for tests, demos and CPU-scale experiments.

Variants: "" = CPU-sized (coin, 2 rooms); "paper" = SEED's batch/group sizes and update settings;
"collect" / "annotate" / "sft" (+ ",paper") = Stage 1 (configs/stage1.py).
"""
from configs import base, stage1
from configs.sciworld import cpu_default, paper_default
from seed_jax.envs import textworld_express


def get_config(variant: str = ""):
  """variant: "", "paper", or a Stage 1 stage with an optional ",paper" (configs/stage1.py), e.g. "sft,paper"."""
  paper, stage = stage1.parse_variant(variant, "textworld_express")
  variant = "paper" if paper else ""
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
  if stage:
    stage1.apply(c, stage, paper)
  return c
