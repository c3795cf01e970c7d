"""Entry point: python -m seed_jax.main --config=configs/<env>.py[:variant] [--workdir=DIR] [--config.x=y]"""
from __future__ import annotations

import logging
import os
import sys
import time

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sciworld.py", "ml_collections config file[:variant]")
_WORKDIR = flags.DEFINE_string("workdir", "", "run folder (logs, checkpoints, dumps); an existing one resumes. "
                               "Default: runs/<env>-<time>")


def generate_once(cfg) -> str:
  import jax
  from seed_jax.models import tokenizer as tokenizer_lib, weights
  from seed_jax.sample import Sampler, SamplerConfig, SamplingParams
  spec, params = weights.load_model(cfg.model.path)
  tok = tokenizer_lib.load_tokenizer(cfg.model.tokenizer or cfg.model.path)
  sampler = Sampler(spec, tok.eos_ids, SamplerConfig(max_prompt_len=cfg.model.max_prompt_tokens,
                                                     dtype=cfg.sampler.dtype))
  sp = SamplingParams(temperature=cfg.generate.temperature, max_new_tokens=cfg.generate.max_new_tokens)
  gen = sampler.generate(params, [tok.encode_chat(cfg.generate.prompt)], jax.random.key(cfg.seed), sp)[0]
  return tok.decode(gen.tokens)


def main(argv):
  del argv
  from seed_jax.config import validate
  cfg = _CONFIG.value
  try:
    validate(cfg)
  except ValueError as e:
    sys.exit(f"config error: {e}")
  if cfg.stage == "generate":
    print(generate_once(cfg))
    return
  from seed_jax import pipeline
  workdir = _WORKDIR.value or os.path.join("runs", f"{cfg.env.name}-{time.strftime('%Y%m%d-%H%M%S')}")
  print(f"seed_jax: workdir {os.path.abspath(workdir)}")
  out = pipeline.train(cfg, workdir)
  m = out["metrics"]
  print(f"seed_jax: done. metrics {os.path.join(workdir, cfg.log.jsonl_name)}, TensorBoard {os.path.join(workdir, cfg.log.tb_subdir)}, "
        f"checkpoints {os.path.join(workdir, 'checkpoints')}, skills/trajectories {os.path.join(workdir, cfg.log.dump_subdir)}")
  for k in sorted(m):
    if k.startswith(("eval/", "rollout/return", "rollout/success", "analysis/", "update/opd")):
      print(f"  {k} = {m[k]}")


def _parse_flags(argv):
  """Bad overrides end the run with one clear line instead of a traceback."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:
    sys.exit(f"config error: unknown config field {str(e).strip(chr(34) + chr(39))!r} in the --config overrides")
  except (TypeError, ValueError, flags.Error) as e:
    sys.exit(f"config error: {e}")


def run():
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
