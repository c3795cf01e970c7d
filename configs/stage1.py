"""Stage 1 variants shared by the environment configs: `:collect`, `:annotate`, `:sft` (CPU-sized, minutes with
SmolLM2-135M) and the same with `,paper` (SEED's values: 180 tasks x 8 rollouts at temperature 0.4, 3 epochs,
lr 5e-6, batch 8, AdamW b=(0.9, 0.95), warmup 10 %, cosine, 8k tokens).

`:warmstart` fine-tunes the policy itself on gold-path demos rendered as RL's step prompts, mixed with hindsight
analyzer records (seed_jax/warmstart.py, seed_jax/hindsight.py); RL then starts from its export. The embedded default runs it as RL's
first phase (warmstart.before_rl) and caches the result.

The three Stage 1 stages share one workdir:
  python -m seed_jax.main --config=configs/textworld_express.py:collect --workdir=runs/twx-stage1
  python -m seed_jax.main --config=configs/textworld_express.py:annotate --workdir=runs/twx-stage1
  python -m seed_jax.main --config=configs/textworld_express.py:sft --workdir=runs/twx-stage1
  python -m seed_jax.main --config=configs/textworld_express.py --config.model.path=runs/twx-stage1/export
"""
STAGES = ("collect", "annotate", "sft", "warmstart")


def apply(c, stage: str, paper: bool) -> None:
  """Sets `c.stage` (each stage is an overlay of configs/variants.py); the module defaults of c.collect /
  c.annotate / c.sft are the paper's values."""
  if stage not in STAGES:
    raise ValueError(f"unknown Stage 1 stage {stage!r}; known: {STAGES}")
  c.stage = stage
  if stage == "warmstart":
    c.warmstart.before_rl = False
    if not paper:
      cpu_warmstart(c)
    return
  if paper:
    c.annotate.analyzer = "external"  # a strong LLM: set analyzer.external.base_url / model / api_key_env
    c.sft.dtype = "bfloat16"
    return
  c.collect.num_tasks, c.collect.rollouts, c.collect.tasks_per_batch = 4, 4, 2
  c.collect.max_new_tokens = c.rollout.max_new_tokens
  c.annotate.max_prompt_tokens, c.annotate.chunk, c.annotate.gold_envs = 1536, 16, 2
  c.annotate.local_max_new_tokens, c.annotate.local_max_batch = 128, 8
  cpu_sft(c)


def cpu_warmstart(c) -> None:
  """The policy warm start sized for a CPU: a few gold-path demos per task family, a short SFT."""
  c.warmstart.num_tasks, c.warmstart.envs = 6, 3
  cpu_sft(c)
  c.sft.remat, c.sft.val_frac = False, 0.0  # memory to spare; too few records to hold any out


def cpu_sft(c) -> None:
  """SFT sized for a CPU: a few steps on a handful of records (analyzer SFT and the policy warm start)."""
  c.sft.max_len = 2048
  c.sft.epochs, c.sft.batch_size = 2, 4
  c.sft.lr = 5e-5  # a few steps on a handful of records: the paper's 5e-6 would barely move the weights
  c.sft.checkpoint.save_interval_steps = 4
