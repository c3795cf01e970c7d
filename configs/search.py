"""Search-QA (text). Variants: "" = CPU-sized; "paper" = SEED's settings (SEED_ALGORITHM.md §3, §5).

Needs questions and a retriever: --config.env.train_files=... --config.env.test_files=... (.jsonl/.parquet
paths or tfds:NAME[/CONFIG]:SPLIT) and a Search-R1 style server at env.retriever_url, e.g. the built-in BM25
one: python -m seed_jax.envs.retriever --corpus passages.jsonl --port 8000. Both variants use Search's loss
settings: invalid-action penalty 0.01, KL 0.001, no entropy bonus; generation stops after a </search> or
</answer>.
"""
from configs import base
from configs.sciworld import cpu_default, paper_default
from seed_jax.envs import search


def get_config(variant: str = ""):
  c = base.get_base()
  c.env = search.default_config()
  c.env.name = "search"
  c.env.train_split = "train"
  c.eval.split = "test"  # Task.family is the data source: accuracy is reported per source
  c.rollout.stop_strings = tuple(f"</{t}>" for t in search.TAGS)
  c.objectives.invalid_penalty = 0.01
  c.objectives.kl_coef, c.objectives.entropy_coef = 0.001, 0.0
  if variant == "":
    cpu_default(c)
  elif variant == "paper":
    paper_default(c)
    c.rollout.tasks_per_update, c.rollout.group_size = 128, 8
    c.env.max_steps, c.env.history_length = 4, 4
  else:
    raise ValueError(f"unknown variant {variant!r} of configs/search.py; known: '', 'paper'")
  return c
