"""Entry point: python -m seed_jax.main --config=configs/<env>.py[:variant] [--workdir=DIR] [--config.x=y]"""
from __future__ import annotations

import logging
import os
import sys
import time
import traceback

from absl import app, flags
from ml_collections import config_flags

from seed_jax.config import CONFIGS_DIR

# The default is found beside the package, so a run from any directory works.
_CONFIG = config_flags.DEFINE_config_file("config", os.path.join(CONFIGS_DIR, "sciworld.py"),
                                          "ml_collections config file[:variant]")
_WORKDIR = flags.DEFINE_string("workdir", "", "run folder (logs, checkpoints, dumps); an existing one resumes. "
                               "Default: runs/<env>-<time>; the Stage 1 stages share runs/<env>-stage1")


def generate_once(cfg) -> str | None:
  """The reply to config.generate.prompt. On a pod the weights are sharded over config.mesh and every process
  joins the collective call; process 0 supplies the prompt and gets the reply (the others None)."""
  import jax
  from seed_jax.models import load
  from seed_jax.config import sampling
  from seed_jax.infra import distributed, mesh as mesh_lib
  from seed_jax.sample import Sampler, SamplerConfig, SamplingParams
  multi = distributed.initialize(cfg.distributed)
  mesh = mesh_lib.mesh_from_config(cfg.mesh) if multi else None
  if multi:
    distributed.check_row_split(mesh)
  spec, params = load.load_model(cfg.model.path, mesh)
  spec = spec.with_attention(cfg.model)
  tok = load.load_tokenizer(cfg.model.tokenizer or cfg.model.path)
  sampler = Sampler(spec, tok.eos_ids, SamplerConfig(max_prompt_len=cfg.model.max_prompt_tokens,
                                                     max_batch=cfg.sampler.max_batch, dtype=cfg.sampler.dtype), mesh)
  sp = SamplingParams(*sampling(cfg, "generate"))
  texts = [cfg.generate.prompt] if jax.process_index() == 0 else []
  replies = sampler.generate_text(params, texts, jax.random.key(cfg.seed), sp, tok)  # collective on a pod
  return replies[0] if replies else None


class StageInputError(Exception):
  """(kind, message): a Stage-1 stage's input that an earlier stage (or the user) did not write."""


def run_stage1(cfg) -> None:
  """collect -> annotate -> sft, each reading what the previous wrote in the same workdir; or warmstart."""
  import json
  import jax
  from seed_jax import sft, stage1
  workdir = _WORKDIR.value or os.path.join("runs", f"{cfg.env.get('name', 'none')}-stage1")
  os.makedirs(workdir, exist_ok=True)
  print(f"seed_jax: stage {cfg.stage}, workdir {os.path.abspath(workdir)}")
  try:
    if cfg.stage == "collect":
      stats = stage1.collect(cfg, workdir)
    elif cfg.stage == "annotate":
      stats = stage1.annotate(cfg, workdir)
    else:
      from seed_jax import warmstart
      out = warmstart.run(cfg, workdir) if cfg.stage == "warmstart" else sft.train(cfg, workdir)
      stats = out["metrics"]
      print(f"seed_jax: exported {out['export_dir']}; start RL with --config.model.path={out['export_dir']}")
  except FileNotFoundError as e:  # a stage's input that an earlier stage (or the user) did not write
    raise StageInputError(f"{cfg.stage} error", _first_line(e)) from e
  if jax.process_index() == 0:
    with open(os.path.join(workdir, f"{cfg.stage}_stats.json"), "w") as f:
      json.dump(stats, f, indent=2)
    for k in sorted(stats):
      print(f"  {k} = {stats[k]}")


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:  # Orbax and JAX log every checkpoint step and backend probe at INFO
    for name in ("absl", "jax"):
      logging.getLogger(name).setLevel(logging.WARNING)
  from seed_jax.config import validate
  cfg = _CONFIG.value
  try:
    validate(cfg)
  except (OSError, ValueError) as e:  # OSError: config_flags defers a config file it could not read to here
    sys.exit(f"config error: {_first_line(e)}")
  from seed_jax import templates
  templates.use(cfg.templates)
  if cfg.compile_cache.enabled:
    from seed_jax.infra import compile_cache
    compile_cache.enable(cfg.compile_cache.dir, cfg.compile_cache.min_compile_time_s)
  if cfg.stage not in ("rl", "eval", "generate"):
    from seed_jax.infra import distributed
    try:
      distributed.initialize(cfg.distributed)  # [scale] Stage 1 on a pod: every process runs the same command
    except distributed.SetupError as e:
      sys.exit(f"multi-host error: {e}")
  if cfg.stage == "generate":
    reply = _guarded(lambda: generate_once(cfg))
    if reply is not None:
      print(reply)
    return
  if cfg.stage in ("collect", "annotate", "sft", "warmstart"):
    _guarded(lambda: run_stage1(cfg))
    return
  from seed_jax import loop
  suffix = "-eval" if cfg.stage == "eval" else ""
  workdir = _WORKDIR.value or os.path.join("runs", f"{cfg.env.name}{suffix}-{time.strftime('%Y%m%d-%H%M%S')}")
  print(f"seed_jax: workdir {os.path.abspath(workdir)}")
  if cfg.stage == "eval":
    run_eval(cfg, workdir)
    return
  out = _guarded(lambda: loop.train(cfg, workdir))
  if out["stopped"]:
    from seed_jax.infra.stop import exit_after_stop
    exit_after_stop(out, workdir)
  from seed_jax.report import CURVES_FILE
  print(f"seed_jax: done. metrics {os.path.join(workdir, cfg.log.jsonl_name)}, curves {os.path.join(workdir, CURVES_FILE)}, "
        f"TensorBoard {os.path.join(workdir, cfg.log.tb_subdir)}, checkpoints {os.path.join(workdir, 'checkpoints')}, "
        f"skills/trajectories {os.path.join(workdir, cfg.log.dump_subdir)}")


def run_eval(cfg, workdir: str) -> None:
  from seed_jax import evaluate
  from seed_jax.infra import distributed
  results = _guarded(lambda: evaluate.run(cfg, workdir))
  if distributed.is_writer():
    print(evaluate.markdown(results), end="")
    print(f"seed_jax: eval done. {os.path.join(workdir, evaluate.RESULTS)}.{{json,md}}")


def _guarded(fn):
  """fn()'s result. Its known errors end the run with one line, on a pod every process with the failing
  process's line (peers.fail_all); an unexpected error on a pod prints its traceback and ends every process too."""
  from seed_jax import evaluate
  from seed_jax.envs.pool import EnvStartError
  from seed_jax.infra import distributed, peers, preflight
  from seed_jax.infra.checkpoint import CheckpointWriteError
  from seed_jax.runtime import ConfigError
  try:
    return fn()
  except preflight.WorkdirError as e:
    kind, message = "workdir error", str(e)
  except CheckpointWriteError as e:  # the run stopped before work it could not save; the same command resumes
    kind, message = "checkpoint error", str(e)
  except distributed.SetupError as e:
    kind, message = "multi-host error", str(e)
  except ConfigError as e:  # a value the build found wrong against the checkpoint, the devices or the env
    kind, message = "config error", str(e)
  except evaluate.EvalSourceError as e:
    kind, message = "eval error", str(e)
  except EnvStartError as e:
    kind, message = "env error", e.line
  except StageInputError as e:
    kind, message = e.args
  except Exception as e:
    if not distributed.is_multi_process():
      raise
    if not peers.posted_elsewhere():  # else this error follows from another process's, whose line is used
      traceback.print_exc()
    kind, message = "fatal error", peers.fatal_message(e, _first_line(e))
  peers.fail_all(kind, message)


def _first_line(e: BaseException) -> str:
  """`e` on one line; a message of several lines is config_flags re-raising a config file's error (an unknown
  variant) with the file's traceback as its text, so the chain's first error speaks instead."""
  while "\n" in str(e).strip() and (e.__cause__ or e.__context__):
    e = e.__cause__ or e.__context__
  return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _missing_config_file(argv) -> str | None:
  """The one line for a --config file that does not exist (config_flags would defer it to the first read)."""
  values = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")]
  path = (values[-1] if values else flags.FLAGS["config"].default).split(":", 1)[0]
  return None if os.path.isfile(path) else f"config error: no config file {path!r}"


def _parse_flags(argv):
  """Bad overrides, variants and config files end the run with one clear line instead of a traceback."""
  missing = _missing_config_file(argv)
  if missing:
    sys.exit(missing)
  try:
    argv = flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:
    sys.exit(f"config error: unknown config field {str(e).strip(chr(34) + chr(39))!r} in the --config overrides")
  except (OSError, TypeError, ValueError, flags.Error) as e:
    sys.exit(f"config error: {_first_line(e)}")
  return argv


def run():
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
