"""Answer one prompt with a model: python -m seed_jax.main --config=configs/generate.py --config.generate.prompt='...'"""
from configs import base, variants


def get_config(variant: str = ""):
  """No variants: the model decides the sizes (config.model.path)."""
  c = base.get_base()
  c.stage = "generate"
  c.env.name = "none"
  return variants.build(variant, "generate", c, lambda c: None, {})
