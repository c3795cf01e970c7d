"""Start-up validation of the whole config: a bad field fails at once with a message naming it.

`CHOICES` is the one table of allowed values; library functions that must reject a bad value when called
directly read it too (`check_choice`). Defaults live in the config files (configs/), not here; mesh presets
(configs/mesh/<name>.py) are read by path with `load_mesh_preset`, so the package never imports `configs`.
"""
from __future__ import annotations

import importlib.util
import os
import urllib.parse
from typing import Any

import ml_collections

from seed_jax import templates

# configs/ beside the package (a checkout or an editable install): config files are found from any cwd.
CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
MESH_PRESETS_DIR = os.path.join(CONFIGS_DIR, "mesh")

CHOICES: dict[str, tuple[str, ...]] = {
    "stage": ("rl", "generate", "collect", "annotate", "sft", "warmstart", "eval"),
    "sampler.dtype": ("float32", "bfloat16"),
    "rescore.dtype": ("float32", "bfloat16"),
    "rescore.old_logps": ("auto", "update", "rescore"),
    "learner.dtype": ("float32", "bfloat16"),
    "learner.remat_saves": ("attention", "projections"),
    "model.attention": ("auto", "blocked", "xla_blockwise", "splash", "cudnn"),
    "learner.teacher": ("old", "current"),
    "learner.schedule": ("constant", "warmup_cosine", "warmup_constant"),
    "analyzer.backend": ("policy", "oracle", "external"),
    "analyzer.control": ("none", "shuffled"),
    "objectives.adv_estimator": ("grpo", "gigpo"),
    "objectives.norm_mode": ("mean_std_norm", "mean_norm"),
    "objectives.grpo_stats": ("step", "trajectory"),
    "objectives.agg_mode": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"),
    "objectives.kl_estimator": ("k1", "k2", "low_var_kl"),
    "objectives.opd_variant": ("gated", "positive_gap", "reverse_kl_adv", "teacher_adv", "none"),
    "annotate.analyzer": ("oracle", "local", "external"),
    "annotate.local_dtype": ("float32", "bfloat16"),
    "sft.schedule": ("constant", "warmup_cosine"),
    "sft.dtype": ("float32", "bfloat16"),
    "warmstart.analyzer_source": ("hindsight", "oracle"),
    "templates.skill_placement": templates.PLACEMENTS,
    "templates.action_list": ("", *templates.ACTION_LISTS),
    "templates.analysis_first_step": (0, 1),
    "templates.history_pairs": ("before", "result"),
    "mesh.ref_params_memory": ("device", "pinned_host"),
}
MESH_AXES = ("data", "fsdp", "tensor")  # the order of mesh.shape and mesh.dcn_shape (seed_jax.infra.mesh)
# Fields checked only when their stage runs.
_STAGE_POSITIVE = {
    "collect": ("collect.num_tasks", "collect.rollouts", "collect.max_new_tokens", "collect.tasks_per_batch",
                "env.max_steps"),
    "annotate": ("annotate.chunk", "annotate.max_prompt_tokens", "annotate.gold_envs", "annotate.local_max_new_tokens",
                 "annotate.local_max_batch"),
    "sft": ("sft.epochs", "sft.batch_size", "sft.max_len", "sft.min_len_bucket", "sft.micro_rows", "sft.vocab_chunk"),
    "warmstart": ("warmstart.num_tasks", "warmstart.envs", "warmstart.policy_weight"),
}
_STAGE_NON_NEGATIVE = {"collect": ("collect.temperature",), "sft": ("sft.lr", "sft.val_every", "sft.warmup_frac"),
                       "warmstart": ("warmstart.max_steps", "warmstart.analyzer_weight", "warmstart.self_play_rollouts",
                                     "warmstart.skill_prompt_weight")}
_POSITIVE = ("model.attention_block", "rollout.tasks_per_update", "rollout.group_size", "rollout.max_new_tokens",
             "model.max_prompt_tokens", "learner.minibatch_size", "learner.micro_batch_size", "learner.ppo_epochs",
             "rescore.vocab_chunk", "env.max_steps")
_NON_NEGATIVE = ("sampler.max_batch", "rescore.max_rows", "sampler.prefill_chunk", "sampler.prefix_reuse_mb",
                 "analyzer.no_repeat_ngram", "train.num_updates", "rollout.temperature", "rollout.top_k", "learner.lr",
                 "eval.every", "eval.max_tasks", "eval.draws", "objectives.opd_coef", "objectives.kl_coef",
                 "objectives.entropy_coef", "rescore.pack_tokens", "rescore.pack_length", "learner.pack_length")


def mesh_presets() -> list[str]:
  """Names of the mesh presets in configs/mesh/."""
  return sorted(f[:-3] for f in os.listdir(MESH_PRESETS_DIR) if f.endswith(".py") and not f.startswith("_"))


def load_mesh_preset(name: str) -> ml_collections.ConfigDict:
  """configs/mesh/<name>.py's mesh: shape, dcn_shape and the hardware it was sized for. The file is read by
  path, so `configs` need not be importable."""
  if name not in mesh_presets():
    raise ValueError(f"unknown mesh preset {name!r}; known: {', '.join(mesh_presets())}")
  spec = importlib.util.spec_from_file_location(f"_seed_jax_mesh_preset_{name}",
                                                os.path.join(MESH_PRESETS_DIR, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_mesh()


def get(cfg: ml_collections.ConfigDict, path: str) -> Any:
  node = cfg
  for part in path.split("."):
    if part not in node:
      raise ValueError(f"config.{path} is missing")
    node = node[part]
  return node


def check_choice(path: str, value: Any) -> None:
  """Rejects a value outside CHOICES[path] with one line naming the field."""
  allowed = CHOICES[path]
  if value not in allowed:
    raise ValueError(f"config.{path}={value!r} is not allowed; choose one of {allowed}")


# use -> (temperature, top_k, top_p, max_new_tokens, no_repeat_ngram) fields: one sampling shape per use of the
# sampler (a number is the value itself: greedy analysis, no top-k/top-p filter).
_SAMPLING = {
    "rollout": ("rollout.temperature", "rollout.top_k", "rollout.top_p", "rollout.max_new_tokens", 0),
    "eval": ("eval.temperature", 0, 1.0, "rollout.max_new_tokens", 0),
    "analysis": (0.0, 0, 1.0, "analyzer.max_new_tokens", "analyzer.no_repeat_ngram"),
    "collect": ("collect.temperature", "rollout.top_k", "collect.top_p", "collect.max_new_tokens", 0),
    "annotate": (0.0, 0, 1.0, "annotate.local_max_new_tokens", 0),
    "generate": ("generate.temperature", 0, 1.0, "generate.max_new_tokens", 0),
}


def sampling(cfg: ml_collections.ConfigDict, use: str) -> tuple[float, int, float, int, int]:
  """The sampling settings of one use of the sampler (a key of _SAMPLING), in sample.SamplingParams' field order:
  `SamplingParams(*config.sampling(cfg, "rollout"))` (sample imports this module, so it builds them)."""
  return tuple(get(cfg, f) if isinstance(f, str) else f for f in _SAMPLING[use])


def check_mesh_shapes(mc: ml_collections.ConfigDict) -> None:
  """mesh.shape / mesh.dcn_shape (a preset's when one is named) as values; whether they fit the devices present is
  checked where the mesh is built (seed_jax.infra.mesh.resolve_shape)."""
  shape, dcn = mc.shape, mc.dcn_shape
  if mc.get("preset"):
    preset = load_mesh_preset(mc.preset)
    shape, dcn = preset.shape, preset.dcn_shape
  shape, dcn = list(shape), list(dcn)
  for name, s in (("mesh.shape", shape), ("mesh.dcn_shape", dcn)):
    if len(s) != len(MESH_AXES):
      raise ValueError(f"config.{name} must have {len(MESH_AXES)} entries for axes {MESH_AXES}, got {s}")
  if shape.count(-1) > 1:
    raise ValueError(f"config.mesh.shape may contain at most one -1, got {shape}")
  if any(s < 1 for s in dcn) or any(s < 1 and s != -1 for s in shape):
    raise ValueError(f"config.mesh sizes must be positive (mesh.shape may use one -1): shape {shape}, dcn_shape {dcn}")


def validate(cfg: ml_collections.ConfigDict) -> None:
  for path in CHOICES:
    check_choice(path, get(cfg, path))
  for path in _POSITIVE:
    if path.startswith("env.") and cfg.stage != "rl":
      continue
    if not get(cfg, path) > 0:
      raise ValueError(f"config.{path}={get(cfg, path)!r} must be > 0")
  for path in _NON_NEGATIVE:
    if not get(cfg, path) >= 0:
      raise ValueError(f"config.{path}={get(cfg, path)!r} must be >= 0")
  # The warm start (its own stage, or RL's first phase) runs the SFT trainer: both sets of fields apply.
  stages = {cfg.stage} | ({"warmstart"} if cfg.stage == "warmstart" or cfg.warmstart.before_rl else set())
  stages |= {"sft"} if "warmstart" in stages else set()
  for stage in sorted(stages):
    for path in _STAGE_POSITIVE.get(stage, ()):
      if not get(cfg, path) > 0:
        raise ValueError(f"config.{path}={get(cfg, path)!r} must be > 0")
    for path in _STAGE_NON_NEGATIVE.get(stage, ()):
      if not get(cfg, path) >= 0:
        raise ValueError(f"config.{path}={get(cfg, path)!r} must be >= 0")
  if "sft" in stages and not 0 <= cfg.sft.val_frac < 1:
    raise ValueError(f"config.sft.val_frac={cfg.sft.val_frac} must be in [0, 1)")
  o = cfg.objectives
  if not (0.0 <= o.clip_low < 1.0 and o.clip_high >= 0.0):
    raise ValueError(f"config.objectives.clip_low={o.clip_low} must be in [0, 1) and "
                     f"config.objectives.clip_high={o.clip_high} >= 0")
  if o.clip_c <= 1.0:
    raise ValueError(f"config.objectives.clip_c={o.clip_c} must be > 1 (dual clip caps the loss at -clip_c*A for A < 0)")
  if not 0 < o.gigpo_similarity <= 1:
    raise ValueError(f"config.objectives.gigpo_similarity={o.gigpo_similarity} must be in (0, 1]")
  fp = tuple(cfg.model.frame_pixels)
  if len(fp) != 2 or not all(isinstance(v, int) and v >= 0 for v in fp) or (fp[1] and fp[0] > fp[1]):
    raise ValueError(f"config.model.frame_pixels={fp} must be (min, max) pixel counts "
                     ">= 0 with min <= max (0 = no bound)")
  check_mesh_shapes(cfg.mesh)
  from seed_jax.infra.faults import parse_plan
  parse_plan(cfg.faults.plan)
  temps = tuple(cfg.eval.get("temperatures", ()))  # the first keeps the untagged eval keys: eval.temperature
  if temps and (temps[0] != cfg.eval.temperature or len(set(temps)) < len(temps) or min(temps) < 0):
    raise ValueError(f"config.eval.temperatures={temps} must hold distinct temperatures >= 0, the first "
                     f"config.eval.temperature={cfg.eval.temperature}")
  if cfg.analyzer.backend == "external" or (cfg.stage == "annotate" and cfg.annotate.analyzer == "external"):
    if cfg.analyzer.external.concurrency < 1:
      raise ValueError(f"config.analyzer.external.concurrency={cfg.analyzer.external.concurrency} must be >= 1")
    url = urllib.parse.urlparse(cfg.analyzer.external.base_url)
    if url.scheme not in ("http", "https") or not url.hostname:
      raise ValueError(f"config.analyzer.external.base_url={cfg.analyzer.external.base_url!r} is not an http(s) URL "
                       "(e.g. http://127.0.0.1:8000/v1)")
    key = cfg.analyzer.external.api_key_env
    if key and not os.environ.get(key):  # the key itself is read from the environment only, when the client starts
      raise ValueError(f"environment variable {key!r} (analyzer.external.api_key_env) is not set; set it or use "
                       "api_key_env='' for a server without keys")
  a = cfg.analyzer
  if 0 <= a.stop_update <= a.start_update:  # the analysis window [start_update, stop_update) would be empty
    raise ValueError(f"config.analyzer.stop_update={a.stop_update} must be < 0 (never stop) or after "
                     f"config.analyzer.start_update={a.start_update}")
  if not 0 < cfg.rollout.top_p <= 1:
    raise ValueError(f"config.rollout.top_p={cfg.rollout.top_p} must be in (0, 1]")
  if cfg.learner.minibatch_size % cfg.learner.micro_batch_size:
    raise ValueError(f"config.learner.minibatch_size={cfg.learner.minibatch_size} must be a multiple of "
                     f"config.learner.micro_batch_size={cfg.learner.micro_batch_size}")
  path = cfg.model.path
  if not path:
    raise ValueError("config.model.path is empty: give --config.model.path=<HF folder | .gguf file | embedded | embedded-vl>")
  if path not in ("embedded", "embedded-vl") and not os.path.exists(path):
    raise ValueError(f"config.model.path={path!r} does not exist")
  if cfg.stage == "annotate" and cfg.annotate.analyzer == "local" and not cfg.annotate.local_model_path:
    raise ValueError("config.annotate.local_model_path is empty: the 'local' analyzer needs a model "
                     "(HF folder | .gguf file | embedded)")
  if cfg.model.attention == "splash" and not cfg.model.attention_interpret:
    import jax
    if jax.default_backend() != "tpu":
      raise ValueError(f"config.model.attention='splash' needs a TPU (this backend: {jax.default_backend()}); "
                       "choose auto, blocked or xla_blockwise, or set config.model.attention_interpret=True to run "
                       "the kernel in Pallas' interpreter (slow)")
  if cfg.model.attention == "cudnn":
    import jax
    if jax.default_backend() != "gpu":
      raise ValueError(f"config.model.attention='cudnn' needs an NVIDIA GPU (this backend: {jax.default_backend()}); "
                       "choose auto, blocked or xla_blockwise (or splash on a TPU)")
  if cfg.eval.get("draws", 0) and cfg.eval.max_tasks:
    raise ValueError(f"config.eval.draws={cfg.eval.draws} (tasks drawn with replacement) and config.eval.max_tasks="
                     f"{cfg.eval.max_tasks} (a panel's subset) exclude each other: set one to 0")
  if cfg.stage == "eval" and cfg.eval.checkpoint and not os.path.exists(cfg.eval.checkpoint):
    raise ValueError(f"config.eval.checkpoint={cfg.eval.checkpoint!r} does not exist")
  needs_env = cfg.stage in ("rl", "collect", "warmstart", "eval") or (cfg.stage == "annotate" and cfg.annotate.analyzer == "oracle")
  if needs_env and "name" not in cfg.env:
    raise ValueError("config.env.name is missing: use an environment config such as configs/sciworld.py")
  from seed_jax.envs import _MODULES as ENVS
  if needs_env and cfg.env.name not in ENVS:  # stage generate plays no env (configs/generate.py: "none")
    raise ValueError(f"config.env.name={cfg.env.name!r} is not an environment; known: {', '.join(sorted(ENVS))}")
  templates.check(cfg.templates, "" if cfg.stage == "generate" else cfg.env.get("name", ""))  # generate: no env
