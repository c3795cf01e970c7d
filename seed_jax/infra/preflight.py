"""Checks that run before a training run loads anything: a usable workdir, disk for its checkpoints. Each
failure is one WorkdirError line naming the problem (seed_jax.main prints it and exits non-zero)."""
from __future__ import annotations

import json
import os
import shutil

import jax
import ml_collections
import numpy as np

from seed_jax.models import transformer as tf_lib
from seed_jax.models.spec import ModelSpec


class WorkdirError(ValueError):
  """The run folder cannot take the run's files."""


def check_workdir(workdir: str) -> None:
  """The run folder exists (created here) and takes files: one clear error before anything is loaded."""
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_probe.{os.getpid()}")  # per process: the hosts of a pod share it
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise WorkdirError(f"workdir {workdir!r} is not usable: {e.strerror or e}") from None


def checkpoint_bytes(spec) -> int:
  """One checkpoint of the train state: fp32 parameters and AdamW's two fp32 moments."""
  shapes = tf_lib.param_shapes(spec)
  n = sum(int(np.prod(s)) for s in jax.tree.leaves(shapes, is_leaf=lambda x: isinstance(x, tuple)))
  return 3 * 4 * n


def check_disk(workdir: str, cfg: ml_collections.ConfigDict, free_bytes: int | None = None) -> None:
  """The workdir's disk holds the checkpoints the run keeps (max_to_keep, plus the one being written): one
  clear error naming the numbers before anything is loaded. Skipped for a model folder without config.json."""
  path = os.path.join(cfg.model.path, "config.json")
  if not os.path.exists(path):
    return
  with open(path) as f:
    spec = ModelSpec.from_hf_config(json.load(f))
  need = checkpoint_bytes(spec) * (cfg.train.checkpoint.max_to_keep + 1)
  free = shutil.disk_usage(workdir).free if free_bytes is None else free_bytes
  if free < need:
    raise WorkdirError(f"workdir {workdir!r} has {free / 2**30:.2f} GiB free, but {cfg.train.checkpoint.max_to_keep}"
                       f" + 1 checkpoints of {checkpoint_bytes(spec) / 2**30:.2f} GiB (fp32 parameters + AdamW "
                       f"moments) need {need / 2**30:.2f} GiB; free space or lower train.checkpoint.max_to_keep")
