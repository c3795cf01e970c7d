"""Search-QA (text). Variants: "" = CPU-sized; "paper" = SEED's settings (docs/algorithm.md §3, §5).

Needs questions and a retriever: --config.env.train_files=... --config.env.test_files=... (.jsonl/.parquet
paths or tfds:NAME[/CONFIG]:SPLIT) and a Search-R1 style server at env.retriever_url, e.g. the built-in BM25
one: python -m seed_jax.envs.retriever --corpus passages.jsonl --port 8000. Both variants use Search's loss
settings: invalid-action penalty 0.01, KL 0.001, no entropy bonus; generation stops after a </search> or
</answer>.
"collect" / "annotate" / "sft" / "warmstart" (+ ",paper") = Stage 1 (configs/stage1.py).
"""
import ml_collections

from configs import base, variants


def get_config(variant: str = ""):
  """variant: names of VARIANTS (configs/variants.py), e.g. "", "paper", "sft,paper"."""
  c = base.get_base()
  c.env = env_config()
  c.env.name = "search"
  c.env.train_split = "train"
  c.eval.split = "test"  # Task.family is the data source: accuracy is reported per source
  # The closing tags of seed_jax.envs.search.TAGS end a CPU run's reply early; :paper samples to EOS as the
  # reference does (base.paper_default), and a reply that opens a second tag is invalid there as here.
  c.rollout.stop_strings = ("</search>", "</answer>")
  c.objectives.invalid_penalty = 0.01
  c.objectives.kl_coef, c.objectives.entropy_coef = 0.001, 0.0
  return variants.build(variant, "search", c, base.cpu_default, VARIANTS)


def paper(c, _=True) -> None:
  base.paper_default(c)
  c.rollout.tasks_per_update, c.rollout.group_size = 128, 8
  c.env.max_steps, c.env.history_length = 4, 4
  c.learner.minibatch_size = 512
  c.learner.schedule, c.learner.warmup_frac = "warmup_constant", 0.1
  c.env.success_reward = 1.0  # exact match in {0, 1}: the 0.01 invalid penalty is the reference's relative size
  c.sft.max_len = 12288  # the reference's Stage-1 SFT length for Search


VARIANTS = {variants.PAPER: paper, **variants.STAGES}


def env_config() -> ml_collections.ConfigDict:
  """The environment's own defaults (config.env before the variant's overrides; `name` is set by get_config)."""
  c = ml_collections.ConfigDict()
  c.max_steps = 4  # turns per episode; the env ends an unanswered episode there (info["truncated"])
  c.history_length = 4  # past (observation, action) pairs shown in the prompt
  c.history_obs_chars = 0  # past observations (retrieved passages) are clipped to this many characters (0 = none)
  c.success_reward = 10.0  # env reward for an exact-match answer (the other text envs also give 10)
  c.require_think = False  # whether a response without <think>...</think> is invalid (Search-R1 does not)
  c.retriever_url = "http://127.0.0.1:8000/retrieve"  # Search-R1 style POST endpoint
  c.topk = 3  # passages appended per search
  c.timeout_s = 10.0  # per HTTP request
  c.retries = 2  # extra attempts after a connection error or a 5xx reply
  c.backoff_s = 0.5  # first retry delay; doubles each attempt
  c.health_check = True  # probe the retriever once per process when an env is made
  c.step_timeout_s = 60.0  # pool deadline of one step: above a search's worst case with its retries
  c.reset_timeout_s = 30.0  # pool deadline of one reset
  c.start_timeout_s = 60.0  # extra time for a fresh worker to start (and pass the health check)
  # Question sources per split, comma-separated: paths to .jsonl/.parquet files or tfds:NAME[/CONFIG]:SPLIT.
  c.train_files = ""
  c.test_files = ""
  c.tfds_data_dir = ""  # TFDS data_dir ("" = TFDS's default, ~/tensorflow_datasets)
  c.max_tasks_per_source = 0  # >0: a fixed seeded subset of that many questions per data source
  c.panel_seed = 0  # seed of that subset (panels are identical on every run and host)
  return c
