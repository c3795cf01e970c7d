"""Wiring: everything a stage builds once from the config. `build_player` builds what playing needs (mesh,
model, tokenizer, sampler, env pool, task panels), which is all the eval stage uses; `build` adds the learner
(rescorer, loss settings, optimizer, update fn) for RL."""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections

from seed_jax import images, losses, sft_oracle
from seed_jax import plan as plan_lib
from seed_jax import tasks as tasks_lib
from seed_jax import update as update_lib
from seed_jax.buckets import CompileCounter
from seed_jax.envs import get_family
from seed_jax.envs.base import Task
from seed_jax.envs.pool import EnvPool
from seed_jax.infra import distributed
from seed_jax.infra import mesh as mesh_lib
from seed_jax.models import load
from seed_jax.models import tokenizer as tokenizer_lib
from seed_jax.rescore import Rescorer, RescorerConfig
from seed_jax.sample import Sampler, SamplerConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass(kw_only=True)
class Player:
  """What playing episodes needs, built once per run from the config."""
  cfg: ml_collections.ConfigDict
  mesh: Any
  spec: Any
  tokenizer: tokenizer_lib.Tokenizer
  family: Any
  pool: EnvPool
  sampler: Sampler
  init_params: Any  # also the frozen KL reference
  train_tasks: list[Task]
  eval_tasks: dict[str, list[Task]]  # split -> its fixed panel
  stop_sequences: list[list[int]]
  gold_cache: dict[str, list[str] | None] = dataclasses.field(default_factory=dict)  # task_id -> gold path

  def gold_paths(self, tasks: Sequence[Task]) -> list[list[str] | None]:
    """Each task's gold path from its reset state (None where the env has none), read once per task on the
    run's pool between phases (the oracle analyzer and the teacher metrics)."""
    todo = list({t.task_id: t for t in tasks if t.task_id not in self.gold_cache}.values())
    if todo:
      golds = sft_oracle.fetch_gold_paths(self.family, self.cfg.env, todo, self.pool.num_envs, pool=self.pool)
      self.gold_cache.update({t.task_id: g for t, g in zip(todo, golds)})
    return [self.gold_cache[t.task_id] for t in tasks]

  def close(self):
    self.pool.close()


@dataclasses.dataclass(kw_only=True)
class Runtime(Player):
  """The player plus the learner: what an RL run builds."""
  rescorer: Rescorer
  update_fn: Any
  optimizer: Any
  loss_cfg: losses.SeedLossConfig
  teacher: update_lib.TeacherPlan
  update_compiles: CompileCounter = dataclasses.field(default_factory=CompileCounter)


def effective_loss_config(cfg: ml_collections.ConfigDict) -> losses.SeedLossConfig:
  """The loss settings; with the analyzer off there is no skill signal: plain GRPO on the same code path."""
  loss_cfg = losses.SeedLossConfig.from_config(cfg.objectives)
  if not cfg.analyzer.enabled and loss_cfg.uses_skill:
    loss_cfg = dataclasses.replace(loss_cfg, opd_variant="none")
  return loss_cfg


def auto_rows(cfg: ml_collections.ConfigDict, spec, mesh, field: str) -> int:
  """`field` ("sampler.max_batch" or "rescore.max_rows"), 0 ("auto") replaced by the largest power of two the
  planner fits in this device's memory (plan.fitting_rows)."""
  a, b = field.split(".")
  rows = cfg[a][b]
  if not rows:
    rows = plan_lib.fitting_rows(cfg, spec, dict(mesh.shape), plan_lib.device_memory_bytes(), field)
    log.info("%s = auto: %d rows fit", field, rows)
  return rows


def _player_parts(cfg: ml_collections.ConfigDict, learner: bool) -> dict[str, Any]:
  """The fields of a Player but its pool (started last, once nothing else can fail). `learner`: also checks
  the learner's settings, before anything loads."""
  multi = distributed.initialize(cfg.distributed)  # [scale] joins a multi-process job before any device use
  image_obs = cfg.env.get("observation", "text") == "image"
  if image_obs and not load.is_vision_language(cfg.model.path):
    raise ValueError(f"config.env.observation='image' needs a vision-language (Qwen2.5-VL) checkpoint, but "
                     f"config.model.path={cfg.model.path!r} is text-only: set config.env.observation='text' or "
                     f"point config.model.path at a Qwen2.5-VL folder (or 'embedded-vl')")
  mesh = mesh_lib.mesh_from_config(cfg.mesh)  # [scale] presets, multi-slice, TPU device order
  if multi:  # each process supplies the rows of its own environments
    distributed.check_row_split(mesh)
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    if learner and cfg.learner.micro_batch_size % dp:
      raise distributed.SetupError(
          f"config.learner.micro_batch_size={cfg.learner.micro_batch_size} does not divide over data x fsdp = "
          f"{dp} devices of {jax.process_count()} processes: make it a multiple of {dp}")
  spec, params = load.load_model(cfg.model.path, mesh)
  spec = spec.with_attention(cfg.model)
  tok = load.load_tokenizer(cfg.model.tokenizer or cfg.model.path)
  if spec.vision is not None:  # the checkpoint's processor bounds and vision tokens
    codec = images.ImageCodec.from_folder(load.resolve_path(cfg.model.path), tuple(cfg.model.frame_pixels))
    tok = images.VLTokenizer(tok, codec)
  family = get_family(cfg.env.name)
  max_prompt = max(cfg.model.max_prompt_tokens, cfg.analyzer.max_prompt_tokens if cfg.analyzer.enabled else 0)
  sampler = Sampler(spec, tok.eos_ids, SamplerConfig(
      max_prompt_len=max_prompt, max_batch=auto_rows(cfg, spec, mesh, "sampler.max_batch"),
      dtype=cfg.sampler.dtype, prefill_chunk=cfg.sampler.prefill_chunk, refill=cfg.sampler.refill,
      prefix_reuse_mb=cfg.sampler.prefix_reuse_mb), mesh)
  return dict(cfg=cfg, mesh=mesh, spec=spec, tokenizer=tok, family=family, sampler=sampler, init_params=params,
              train_tasks=family.tasks(cfg.env, cfg.env.train_split), eval_tasks=tasks_lib.eval_panels(family, cfg),
              stop_sequences=[tok.encode(s) for s in cfg.rollout.stop_strings])


def _pool(cfg: ml_collections.ConfigDict, family) -> EnvPool:
  procs = jax.process_count()  # [scale] each process's pool holds its share of the groups and eval episodes
  n_envs = max(-(-cfg.rollout.tasks_per_update // procs) * cfg.rollout.group_size,
               -(-tasks_lib.eval_chunk(cfg) // procs))
  return EnvPool(family, cfg.env, n_envs)


class ConfigError(ValueError):
  """A config value that the build found unusable against what it loaded (the checkpoint, the devices, the
  environment): `main` prints it as one `config error:` line."""


def _config_errors(build_fn):
  """A plain ValueError raised while building from the config names a config value (every build check does):
  it becomes a ConfigError. Kinds with a line of their own (distributed.SetupError) pass through."""
  @functools.wraps(build_fn)
  def wrapped(cfg: ml_collections.ConfigDict):
    try:
      return build_fn(cfg)
    except ValueError as e:
      if type(e) is not ValueError:
        raise
      raise ConfigError(str(e)) from e
  return wrapped


@_config_errors
def build_player(cfg: ml_collections.ConfigDict) -> Player:
  parts = _player_parts(cfg, learner=False)
  return Player(**parts, pool=_pool(cfg, parts["family"]))


@_config_errors
def build(cfg: ml_collections.ConfigDict) -> Runtime:
  if cfg.analyzer.enabled and cfg.analyzer.backend == "oracle" and not get_family(cfg.env.name).has_gold_paths:
    raise ValueError(f"config.analyzer.backend='oracle' reads gold paths, which environment {cfg.env.name!r} does "
                     "not have: use 'policy' or 'external'")
  loss_cfg, teacher = learner_plan(cfg)  # the teacher and layout rules, before anything loads
  parts = _player_parts(cfg, learner=True)
  spec, mesh = parts["spec"], parts["mesh"]
  rescorer = Rescorer(spec, parts["tokenizer"].pad_id, RescorerConfig(
      max_rows=auto_rows(cfg, spec, mesh, "rescore.max_rows"), max_prompt_len=cfg.model.max_prompt_tokens,
      max_response_len=cfg.rollout.max_new_tokens, vocab_chunk=cfg.rescore.vocab_chunk, dtype=cfg.rescore.dtype,
      pack_length=cfg.rescore.pack_length, pack_tokens=cfg.rescore.pack_tokens,
      share_prefix=cfg.rescore.share_prefix), mesh)
  return Runtime(**parts, pool=_pool(cfg, parts["family"]), rescorer=rescorer,
                 **learner(cfg, spec, parts["init_params"], loss_cfg, teacher))


def learner_plan(cfg: ml_collections.ConfigDict) -> tuple[losses.SeedLossConfig, update_lib.TeacherPlan]:
  loss_cfg = effective_loss_config(cfg)
  return loss_cfg, update_lib.teacher_plan(loss_cfg, cfg.learner.teacher, pack_length=cfg.learner.pack_length,
                                           images=cfg.env.get("observation", "text") == "image")


def learner(cfg: ml_collections.ConfigDict, spec, params, loss_cfg: losses.SeedLossConfig,
            teacher: update_lib.TeacherPlan) -> dict[str, Any]:
  """The Runtime fields that depend on the loss: several learners can share one player (seed_jax.paired)."""
  optimizer = update_lib.make_optimizer(cfg.learner)
  update_fn = update_lib.make_update_fn(
      spec, loss_cfg, optimizer, micro_batch_size=cfg.learner.micro_batch_size, dtype=jnp.dtype(cfg.learner.dtype),
      chunk=cfg.rescore.vocab_chunk, remat=cfg.learner.remat and cfg.learner.remat_saves, teacher=teacher,
      state_shardings=update_lib.state_shardings(params, optimizer))  # [scale] the state keeps its layout
  return dict(update_fn=update_fn, optimizer=optimizer, loss_cfg=loss_cfg, teacher=teacher,
              update_compiles=CompileCounter())
