"""Answer one prompt with a model: python -m seed_jax.main --config=configs/generate.py --config.generate.prompt='...'"""
from configs import base


def get_config(variant: str = ""):
  c = base.get_base()
  c.stage = "generate"
  c.env.name = "none"
  return c
