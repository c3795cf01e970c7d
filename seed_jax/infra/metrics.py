"""Per-step metrics (JSONL + TensorBoard + optional Weights & Biases), JSONL dumps and phase timing.

Only the writer process (process 0) touches the file system; every process may time phases. Non-finite values
never crash a run: they become null in JSONL and are skipped in TensorBoard and W&B.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import sys
import time
from typing import Any, Iterable, Iterator, Mapping

import ml_collections
import numpy as np

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def _scalar(key: str, value: Any) -> int | float | None:
  """A Python number for one metric value; None when it is not finite."""
  if isinstance(value, (bool, np.bool_)):
    return int(value)
  if isinstance(value, (int, np.integer)):
    return int(value)
  arr = np.asarray(value)  # also jax arrays and 0-d numpy arrays
  if arr.size != 1 or arr.dtype.kind not in "biuf":
    raise ValueError(f"metric {key!r} must be a real scalar, got {type(value).__name__} "
                     f"with shape {arr.shape} and dtype {arr.dtype}")
  if arr.dtype.kind in "biu":
    return int(arr.reshape(()))
  x = float(arr.reshape(()))
  return x if math.isfinite(x) else None


def to_jsonable(x: Any) -> Any:
  """Plain JSON values for dataclasses, mappings, sequences, numpy/jax arrays; non-finite floats -> None."""
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    return to_jsonable(dataclasses.asdict(x))
  if isinstance(x, Mapping):
    return {str(k): to_jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple, set, frozenset)):
    return [to_jsonable(v) for v in x]
  if isinstance(x, float):
    return x if math.isfinite(x) else None
  if x is None or isinstance(x, (str, bool, int)):
    return x
  if hasattr(x, "__array__") or isinstance(x, np.generic):
    arr = np.asarray(x)
    return to_jsonable(arr.item() if arr.ndim == 0 else arr.tolist())
  return str(x)


def _tensorboardx():
  """tensorboardX, imported without PyTorch: its writer module imports torch, where installed, only to accept
  torch tensors (seconds of a process's start: docs/benchmarks.md); this writer passes Python floats. A `None`
  in sys.modules makes that import fail as if torch were absent, for the duration of this import only."""
  if "tensorboardX" in sys.modules or "torch" in sys.modules:
    import tensorboardX  # pylint: disable=import-outside-toplevel
    return tensorboardX
  sys.modules["torch"] = None  # type: ignore[assignment]
  try:
    import tensorboardX  # pylint: disable=import-outside-toplevel
  finally:
    del sys.modules["torch"]
  return tensorboardX


class MetricsWriter:
  """Writes one flat dict of scalars per step. With `is_writer=False` every write is a no-op."""

  def __init__(self, workdir: str, is_writer: bool, cfg: ml_collections.ConfigDict,
               run_config: Mapping[str, Any] | None = None):
    """`cfg`: config.log."""
    self.cfg = cfg
    self.workdir = workdir
    self.is_writer = is_writer
    self._jsonl = self._tb = self._wandb = None
    if not is_writer:
      return
    os.makedirs(workdir, exist_ok=True)
    # Appending keeps the history across restarts; `rewind` drops what a resumed run redoes.
    self._jsonl = open(os.path.join(workdir, cfg.jsonl_name), "a", encoding="utf-8")
    if cfg.tensorboard:
      self._tb = _tensorboardx().SummaryWriter(logdir=os.path.join(workdir, cfg.tb_subdir))
    if cfg.wandb:
      try:
        import wandb  # pylint: disable=import-outside-toplevel
      except ImportError:
        log.warning("metrics.wandb is on but the wandb package is not installed; logging without it")
      else:
        self._wandb = wandb.init(project=cfg.wandb_project, entity=cfg.wandb_entity or None,
                                 name=cfg.wandb_run_name or None, mode=cfg.wandb_mode, dir=workdir,
                                 config=to_jsonable(dict(run_config or {})), resume="allow")

  def write(self, step: int, scalars: Mapping[str, Any]) -> dict[str, Any]:
    """Logs `scalars` at `step`; returns the JSONL record (also on non-writers, for printing)."""
    values = {}
    for key, value in scalars.items():
      if not isinstance(key, str) or not key or key in ("step", "wall_time"):
        raise ValueError(f"metric name must be a non-empty string other than 'step'/'wall_time', got {key!r}")
      values[key] = _scalar(key, value)
    record = {"step": int(step), "wall_time": time.time(), **values}
    if not self.is_writer:
      return record
    self._jsonl.write(json.dumps(record, allow_nan=False) + "\n")
    self._jsonl.flush()
    finite = {k: v for k, v in values.items() if v is not None}
    if self._tb is not None:
      for k, v in finite.items():
        self._tb.add_scalar(k, float(v), global_step=int(step), walltime=record["wall_time"])
      self._tb.flush()
    if self._wandb is not None:
      self._wandb.log(finite, step=int(step))
    return record

  def rewind(self, next_update: int) -> int:
    """Drops the records a run resuming at `next_update` will write again (updates from `next_update` on,
    evaluations after more updates than that, and the at-start evaluation when nothing was saved), so
    metrics.jsonl holds one record per finished update and evaluation. Returns how many were dropped."""
    if not self.is_writer:
      return 0
    path = os.path.join(self.workdir, self.cfg.jsonl_name)
    self._jsonl.close()
    with open(path, encoding="utf-8") as f:
      lines = [line for line in f if line.strip()]
    keep = []
    for line in lines:
      try:
        r = json.loads(line)
      except json.JSONDecodeError:  # a line cut off by a kill: redone
        continue
      is_eval = "eval/updates_done" in r
      if r["step"] < next_update or (is_eval and 0 < next_update == r["step"]):
        keep.append(line)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.writelines(keep)
    os.replace(tmp, path)
    self._jsonl = open(path, "a", encoding="utf-8")
    return len(lines) - len(keep)

  def has_record(self, step: int, key: str) -> bool:
    """Whether metrics.jsonl holds a record at `step` with `key` (e.g. an evaluation already taken)."""
    if not self.is_writer:
      return False
    self._jsonl.flush()
    with open(os.path.join(self.workdir, self.cfg.jsonl_name), encoding="utf-8") as f:
      for line in f:
        try:
          r = json.loads(line)
        except json.JSONDecodeError:
          continue
        if r.get("step") == step and key in r:
          return True
    return False

  def phase_timer(self) -> "PhaseTimer":
    """A timer whose bars show on the writer process only, when metrics.progress is on and stdout is a TTY."""
    return PhaseTimer(progress=bool(self.cfg.progress and self.is_writer and sys.stdout.isatty()))

  def dump_path(self, name: str, step: int) -> str:
    if not _NAME_RE.match(name):
      raise ValueError(f"dump name must match {_NAME_RE.pattern}, got {name!r}")
    return os.path.join(self.workdir, self.cfg.dump_subdir, f"{name}_step{int(step):06d}.jsonl")

  def dump_jsonl(self, name: str, step: int, records: Iterable[Any]) -> str | None:
    """Writes `records` (dicts or dataclasses, e.g. skills or trajectories) as one JSONL file for `step`.
    Written to a temporary name and renamed, so a reader never sees half a file. Returns the path."""
    path = self.dump_path(name, step)
    if not self.is_writer:
      return None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      for r in records:
        f.write(json.dumps(to_jsonable(r), ensure_ascii=False, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None

  def __enter__(self) -> "MetricsWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class _NoBar:
  def update(self, n: int = 1) -> None:
    pass

  def set_postfix(self, *args, **kwargs) -> None:
    pass


class PhaseTimer:
  """Wall time per phase of one step: `with timer.phase("rollout", total=n) as bar: ...; bar.update()`;
  `pop()` returns {"time/rollout_s": ...} (sums repeated phases) and starts the next step."""

  def __init__(self, progress: bool | None = None):
    # None: bars only when stdout is a terminal (never in log files or CI).
    self.progress = sys.stdout.isatty() if progress is None else progress
    self._seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def phase(self, name: str, total: int | None = None) -> Iterator[Any]:
    if not _NAME_RE.match(name):
      raise ValueError(f"phase name must match {_NAME_RE.pattern}, got {name!r}")
    bar: Any = _NoBar()
    if self.progress:
      import tqdm  # pylint: disable=import-outside-toplevel
      bar = tqdm.tqdm(total=total, desc=name, leave=False, file=sys.stdout, dynamic_ncols=True)
    start = time.perf_counter()
    try:
      yield bar
    finally:
      self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - start
      if self.progress:
        bar.close()

  def pop(self) -> dict[str, float]:
    out = {f"time/{k}_s": v for k, v in self._seconds.items()}
    self._seconds = {}
    return out
