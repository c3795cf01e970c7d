"""Shared defaults of every run; environment configs start from `get_base()` and override."""
import importlib
import os

import ml_collections

from seed_jax import objectives, sft, skills, stage1, update
from seed_jax.infra import checkpoint, distributed, mesh, metrics


def get_base() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # "rl" (SEED / GRPO) | "generate" (answer `generate.prompt` with the model and exit) | Stage 1: "collect"
  # (base-policy trajectories), "annotate" (hindsight skills -> SFT records), "sft" (train + export an HF folder)
  c.stage = "rl"

  c.model = ml_collections.ConfigDict()
  c.model.path = "embedded"  # HF checkpoint folder, .gguf file, or "embedded" (SmolLM2-135M-Instruct)
  c.model.tokenizer = ""  # "" = from model.path
  c.model.max_prompt_tokens = 1024  # step prompts are fitted to this by dropping the oldest history pairs

  c.env = ml_collections.ConfigDict()  # filled by the environment config (name + its default_config())

  c.rollout = ml_collections.ConfigDict()
  c.rollout.tasks_per_update = 16  # B: distinct task instances per update
  c.rollout.group_size = 8  # G: envs per task, all reset to the same instance
  c.rollout.temperature = 1.0
  c.rollout.top_p = 1.0
  c.rollout.top_k = 0
  c.rollout.max_new_tokens = 512
  c.rollout.stop_strings = ("</action>",)  # generation of a row also ends at these (after EOS)

  c.analyzer = skills.default_config()
  c.analyzer.enabled = True  # False = plain GRPO baseline (no analysis, no OPD), same code path
  c.analyzer.start_update = 0  # OPD active from this update ...
  c.analyzer.stop_update = -1  # ... until this one (exclusive); -1 = to the end

  c.objectives = objectives.default_config()
  c.learner = update.default_config()  # the update step (optimizer, mini-batching, teacher)

  c.sampler = ml_collections.ConfigDict()
  c.sampler.dtype = "float32"  # "bfloat16": bf16 weights and KV cache in generation (fp32 logits/softmax)
  c.sampler.max_batch = 64  # rows per generation call; more run as several calls

  c.rescore = ml_collections.ConfigDict()
  c.rescore.max_rows = 64  # contexts x samples per forward pass
  c.rescore.vocab_chunk = 128  # response positions per vocabulary-projection chunk
  c.rescore.dtype = "float32"

  # Device mesh. Either name a preset (--config.mesh.preset=v5p_64, a file in configs/mesh/) or set
  # --config.mesh.shape / --config.mesh.dcn_shape by hand; a preset's fields win over hand-set ones.
  c.mesh = mesh.default_config()
  c.distributed = distributed.default_config()  # multi-process start-up (TPU pods detect themselves)

  c.train = ml_collections.ConfigDict()
  c.train.num_updates = 150
  c.train.dump_trajectories = 4  # trajectories dumped as JSONL per update
  c.train.checkpoint = checkpoint.default_config()
  c.train.checkpoint.save_interval_steps = 1

  c.eval = ml_collections.ConfigDict()
  c.eval.temperature = 0.4
  c.eval.split = "eval"
  c.eval.max_tasks = 0  # 0 = the whole panel
  c.eval.every = 10  # updates between evaluations (0 = never during training)
  c.eval.at_end = True
  c.eval.batch_envs = 0  # minimum pool size for evaluation (the pool has at least B*G envs)

  c.log = metrics.default_config()

  c.collect = stage1.collect_config()  # stage "collect"
  c.annotate = stage1.annotate_config()  # stage "annotate" ("external" uses analyzer.external)
  c.sft = sft.default_config()  # stage "sft"

  c.generate = ml_collections.ConfigDict()
  c.generate.prompt = "What is the capital of France?"
  c.generate.max_new_tokens = 64
  c.generate.temperature = 0.0
  return c


def mesh_presets() -> list[str]:
  """Names of the mesh presets in configs/mesh/."""
  folder = os.path.join(os.path.dirname(__file__), "mesh")
  return sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py") and not f.startswith("_"))


def load_mesh_preset(name: str) -> ml_collections.ConfigDict:
  """configs/mesh/<name>.py's mesh: shape, dcn_shape and the hardware it was sized for."""
  if name not in mesh_presets():
    raise ValueError(f"unknown mesh preset {name!r}; known: {', '.join(mesh_presets())}")
  return importlib.import_module(f"configs.mesh.{name}").get_mesh()
