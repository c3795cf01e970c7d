"""ScienceWorld. Variants: "" = the embedded default sized for a CPU in minutes; "paper" = SEED's settings;
"collect" / "annotate" / "sft" (+ ",paper") = Stage 1 (configs/stage1.py).

python -m seed_jax.main --config=configs/sciworld.py[:paper] [--config.model.path=...]
"""
from configs import base, stage1
from seed_jax.envs import sciworld


def get_config(variant: str = ""):
  """variant: "", "paper", or a Stage 1 stage with an optional ",paper" (configs/stage1.py), e.g. "sft,paper"."""
  paper, stage = stage1.parse_variant(variant, "sciworld")
  variant = "paper" if paper else ""
  c = base.get_base()
  c.env = sciworld.default_config()
  c.env.name = "sciworld"
  c.env.train_split = "train"
  c.eval.split = "eval_l0,eval_l2"
  if variant == "":
    cpu_default(c)
    c.env.task_types = "boil,find-living-thing,measure-melting-point-known-substance"
  elif variant == "paper":
    paper_default(c)
  if stage:
    stage1.apply(c, stage, paper)
  return c


def cpu_default(c):
  """Small enough to finish on a laptop CPU in minutes with SmolLM2-135M: few tasks, short answers."""
  c.rollout.tasks_per_update, c.rollout.group_size = 2, 2
  c.rollout.max_new_tokens = 48
  c.env.max_steps, c.env.history_length = 4, 2
  c.model.max_prompt_tokens = 1024
  c.analyzer.max_prompt_tokens, c.analyzer.max_new_tokens = 1536, 96
  c.learner.minibatch_size, c.learner.micro_batch_size = 16, 4
  c.learner.remat = False  # a CPU has memory to spare; recomputing layers in the backward pass only costs time
  c.train.num_updates = 2
  c.eval.every, c.eval.max_tasks = 0, 4
  c.sampler.max_batch = 16


def paper_default(c):
  """SEED's model-side settings (SEED_ALGORITHM.md §2-3): a 3B checkpoint, 4k step prompts, 16k/4k analysis,
  mini-batches of 256 step-samples, bf16 compute. B, G and the env's steps/history are the env config's."""
  c.model.path = ""  # required: --config.model.path=/path/to/Qwen2.5-3B-Instruct (SFT checkpoint)
  c.model.max_prompt_tokens = 4096
  c.analyzer.max_prompt_tokens, c.analyzer.max_new_tokens = 16384, 4096
  c.learner.minibatch_size = 256
  c.sampler.dtype = c.rescore.dtype = c.learner.dtype = "bfloat16"
