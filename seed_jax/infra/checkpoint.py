"""Train-state checkpoints on Orbax: one pytree of arrays plus JSON metadata per step.

Each step directory holds two items: `state` (any pytree of jax arrays: params, optimizer state, step, RNG
key) and `meta` ({"fingerprint": ..., "metadata": ...}: task-sampler position, metrics history, ...). Orbax
writes a step into a temporary directory and renames it when complete, so a crash never leaves a step that
`latest_step`/`restore` would pick up. Saves are asynchronous; `wait()` blocks until they are on disk.

The fingerprint is a flat dict of config fields that must be equal to resume (architecture, shapes, vocab):
restoring under a different one fails with an error that names each differing field and both values.
Every process calls save/restore (Orbax coordinates the writers in multi-host runs).

A failed asynchronous write (a full disk) surfaces as one CheckpointWriteError naming the step, the folder and
the OS's cause at the first `poll()`, `save()` or `wait()` after it; Orbax's own tracebacks of it are dropped.

A step proves itself on restore: `meta` carries every array's checksum (checksum.py, independent of the mesh)
and a digest of its own JSON, so flipped bytes in a data or metadata file, a truncated or a deleted file all fail
the restore or the comparison (TensorStore restores some damaged data files without any error). `restore_latest`
reports such a step in one line, moves it to <directory>.damaged/ and resumes from the newest intact one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
import traceback
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from seed_jax.infra import checksum

log = logging.getLogger(__name__)
_MISSING = "<missing>"


class IncompatibleCheckpointError(ValueError):
  pass


class CheckpointWriteError(RuntimeError):
  """An asynchronous save failed; its message is one line: the step, the folder, the cause, what is saved."""


class DamagedCheckpointError(RuntimeError):
  """A step's files restore to something other than what was saved (or do not restore)."""


def _digest(meta: Mapping[str, Any]) -> str:
  body = {k: v for k, v in meta.items() if k != "digest"}
  return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class _DropOrbaxErrors(logging.Filter):
  """Orbax logs a failed background write as several ERROR tracebacks, and asyncio its abandoned write tasks
  at exit (futures whose exception was never retrieved: Orbax shows only in the record's traceback, or, for
  TensorStore's frameless errors, in the path of Orbax's temporary step folder); CheckpointWriteError reports
  the failure once."""
  MARKS = (f"{os.sep}orbax{os.sep}", ".orbax-checkpoint-tmp")

  def filter(self, record: logging.LogRecord) -> bool:
    where = [record.pathname, record.getMessage()]
    if record.exc_info and record.exc_info[2] is not None:
      where += [frame.filename for frame in traceback.extract_tb(record.exc_info[2])]
    return not (record.levelno >= logging.ERROR and any(m in w for m in self.MARKS for w in where))


for _name in ("absl", "asyncio"):
  logging.getLogger(_name).addFilter(_DropOrbaxErrors())


def _drop_closed_loop_callbacks(previous):
  """After a failed write, TensorStore completes the save's other pending writes into the event loop Orbax has
  closed; each prints an unraisable 'Event loop is closed' traceback. After a failed read (a damaged step,
  reported once by restore_latest), Orbax's abandoned reads of the other shards print theirs when collected.
  Those alone are dropped."""
  def hook(u):
    closed = isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed"
    frames = traceback.extract_tb(u.exc_traceback) if u.exc_traceback is not None else []
    abandoned_read = any(f.name == "_read_array_index_and_device_put" and f"{os.sep}orbax{os.sep}" in f.filename
                         for f in frames)
    if not (closed or abandoned_read):
      previous(u)
  hook.drops_closed_loop_callbacks = True
  return hook


if not getattr(sys.unraisablehook, "drops_closed_loop_callbacks", False):
  sys.unraisablehook = _drop_closed_loop_callbacks(sys.unraisablehook)


def _cause(e: BaseException) -> str:
  """The OS's reason for a failed write ("No space left on device"), else the error's last clause."""
  x: BaseException | None = e
  while x is not None:
    if isinstance(x, OSError) and x.strerror:
      return x.strerror
    x = x.__cause__ or x.__context__
  text = " ".join(str(e).split())
  code = re.search(r"\[os_error_code='(\d+)'\]", text)  # TensorStore's errors carry the errno
  if code:
    return f"{os.strerror(int(code.group(1)))} (errno {code.group(1)})"
  return (text.rsplit(": ", 1)[-1] or type(e).__name__)[:300]


def config_fingerprint(cfg: Any, keys: Sequence[str]) -> dict[str, Any]:
  """{dotted key: value} for the config fields that must match on restore, e.g. ["model.num_layers"]."""
  out = {}
  for key in keys:
    node = cfg
    for part in key.split("."):
      try:
        node = node[part]
      except (KeyError, TypeError, AttributeError):
        raise KeyError(f"fingerprint key {key!r}: config has no field {part!r}") from None
    out[key] = node.to_dict() if isinstance(node, ml_collections.ConfigDict) else node
  return _json_normalize(out)


def _json_normalize(x: Any) -> Any:
  """The value as it reads back from JSON (tuples become lists), so stored and current compare equal."""
  return json.loads(json.dumps(x))


def abstract_state(tree: Any) -> Any:
  """ShapeDtypeStructs (with shardings) describing a concrete state: the restore target for the same layout."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
                      tree)


def array_specs(tree: Any) -> dict[str, str]:
  """{key path: "shape dtype"} of every array leaf (concrete or abstract), as JSON keeps it."""
  return {jax.tree_util.keystr(p): f"{tuple(x.shape)} {x.dtype}" for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def fingerprint_diff(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
  """'field: checkpoint=A, current=B' for every field whose values differ (or exist on one side only)."""
  diffs = []
  for key in sorted(set(saved) | set(current)):
    a, b = saved.get(key, _MISSING), current.get(key, _MISSING)
    if a != b:
      diffs.append(f"{key}: checkpoint={a!r}, current={b!r}")
  return diffs


class Checkpointer:
  """Orbax CheckpointManager with the project's two items and a fingerprint check on restore."""

  def __init__(self, directory: str, cfg: ml_collections.ConfigDict, fingerprint: Mapping[str, Any] | None = None,
               read_only: bool = False):
    """`cfg`: config.train.checkpoint or config.sft.checkpoint (max_to_keep, save_interval_steps, async_save)."""
    if cfg.max_to_keep is not None and cfg.max_to_keep < 1:
      raise ValueError(f"checkpoint.max_to_keep must be >= 1 (or None for all), got {cfg.max_to_keep}")
    if cfg.save_interval_steps < 1:
      raise ValueError(f"checkpoint.save_interval_steps must be >= 1, got {cfg.save_interval_steps}")
    self.directory = os.path.abspath(directory)
    if read_only and not os.path.isdir(self.directory):
      raise FileNotFoundError(f"checkpoint directory {self.directory} does not exist")
    self.save_interval_steps = cfg.save_interval_steps
    self.fingerprint = _json_normalize(dict(fingerprint)) if fingerprint is not None else None
    options = ocp.CheckpointManagerOptions(
        max_to_keep=cfg.max_to_keep, save_interval_steps=1,  # the interval is applied in save()
        enable_async_checkpointing=cfg.async_save, create=not read_only, read_only=read_only,
        cleanup_tmp_directories=not read_only)  # leftovers of a crashed save are removed on start
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))
    self._pending: int | None = None  # step of the asynchronous save not yet known to have succeeded
    self._failed = False

  def save(self, step: int, state: Any, metadata: Mapping[str, Any] | None = None, force: bool = False) -> bool:
    """Starts saving `state` and `metadata` (JSON values) at `step`; False when the interval skips it."""
    if not force and step % self.save_interval_steps:
      return False
    meta = {"fingerprint": self.fingerprint, "metadata": dict(metadata or {})}
    try:
      json.dumps(meta)
    except TypeError as e:
      raise ValueError(f"checkpoint metadata must be JSON values: {e}") from None
    meta["arrays"] = array_specs(state)
    meta["checksums"] = checksum.tree_checksums(state)
    meta["digest"] = _digest(meta)
    self.wait()  # Orbax waits for the previous save anyway; its failure is reported as that step's
    started = self._manager.save(int(step), force=force, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
    self._pending = int(step) if started else None
    return started

  def poll(self) -> None:
    """Raises CheckpointWriteError if the last asynchronous save has failed; never waits for one still running."""
    if self._pending is not None and not self._manager.is_saving_in_progress():
      self.wait()

  def wait(self) -> None:
    """Blocks until the last save is on disk; CheckpointWriteError if it failed."""
    step, self._pending = self._pending, None
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # Orbax re-raises the background thread's error here
      if step is None:
        raise
      self._failed = True
      saved = [s for s in self.all_steps() if s != step]
      raise CheckpointWriteError(
          f"checkpoint {step} could not be written in {self.directory}: {_cause(e)}; "
          + (f"the latest saved checkpoint is {saved[-1]}" if saved else "no checkpoint is saved")) from None

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def _check_step(self, step: int | None) -> int:
    self.wait()
    steps = self.all_steps()
    if not steps:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    if step is None:
      return steps[-1]
    if step not in steps:
      raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; available steps: {steps}")
    return step

  def restore_metadata(self, step: int | None = None) -> dict[str, Any]:
    """The stored {"fingerprint": ..., "metadata": ..., "checksums": ...} of `step` (default: latest);
    DamagedCheckpointError if it does not read back as written."""
    step = self._check_step(step)
    try:
      meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:
      raise DamagedCheckpointError(f"its metadata does not read: {_cause(e)}") from e
    legacy = isinstance(meta, dict) and set(meta) == {"fingerprint", "metadata"}  # written before digests
    if not isinstance(meta, dict) or not legacy and meta.get("digest") != _digest(meta):
      raise DamagedCheckpointError("its metadata differs from what was written (digest)")
    return meta

  def restore(self, step: int | None, abstract: Any) -> tuple[Any, dict[str, Any]]:
    """(state, metadata) of `step` (None: latest). `abstract` is a pytree of jax.ShapeDtypeStruct whose
    shardings decide where every restored array lives (any mesh, so a run can resume on another layout).
    DamagedCheckpointError if a file does not restore or an array differs from its saved checksum."""
    step = self._check_step(step)
    meta = self.restore_metadata(step)
    if self.fingerprint is not None:
      diffs = fingerprint_diff(meta.get("fingerprint") or {}, self.fingerprint)
      if diffs:
        raise IncompatibleCheckpointError(
            f"checkpoint {self.directory} step {step} does not match the current config: " + "; ".join(diffs))
    if "checksums" not in meta:  # a step written before checksums were kept: restored unchecked
      return self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract)))["state"], meta["metadata"]
    if diffs := fingerprint_diff(meta["arrays"], array_specs(abstract)):  # another model or optimizer, not damage
      raise IncompatibleCheckpointError(f"checkpoint {self.directory} step {step} holds other arrays than this "
                                        f"run's state: {diffs[0]}" + (f" (and {len(diffs) - 1} more)" if diffs[1:] else ""))
    try:
      state = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
    except Exception as e:
      raise DamagedCheckpointError(f"its arrays do not restore: {_cause(e)}") from e
    if bad := checksum.differing(meta["checksums"], checksum.tree_checksums(state)):
      raise DamagedCheckpointError(f"{len(bad)} of {len(meta['checksums'])} arrays differ from their saved "
                                   f"checksums, first {bad[0]}")
    return state, meta["metadata"]

  def restore_latest(self, abstract: Any) -> tuple[Any, dict[str, Any]] | None:
    """(state, metadata) of the newest intact step; None when there is none. Each damaged step on the way is
    reported in one line and moved to <directory>.damaged/<step> (kept for a look, out of Orbax's sight). Every
    process calls it; they agree on each step, so a damage only one process reads is a damage for all."""
    for step in reversed(self.all_steps()):
      try:
        out, cause = self.restore(step, abstract), ""
      except DamagedCheckpointError as e:
        out, cause = None, str(e)
      if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        if not np.all(multihost_utils.process_allgather(np.int32(out is not None))):
          out, cause = None, cause or "damaged as another process reads it"
      if out is not None:
        return out
      older = [s for s in self.all_steps() if s < step]
      log.warning("checkpoint %d is damaged (%s); %s", step, cause,
                  f"resuming from {older[-1]}" if older else "no older checkpoint: starting from the beginning")
      self._move_aside(step)
    return None

  def _move_aside(self, step: int) -> None:
    if jax.process_index() == 0:
      dest = os.path.join(f"{self.directory}.damaged", str(step))
      k = 1
      while os.path.exists(dest):
        dest, k = os.path.join(f"{self.directory}.damaged", f"{step}.{k}"), k + 1
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      shutil.move(os.path.join(self.directory, str(step)), dest)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices(f"checkpoint {step} moved aside")
    self._manager.reload()

  def close(self) -> None:
    try:
      if not self._failed:  # after a reported failure Orbax would raise the same error again
        self.wait()
    finally:
      try:
        self._manager.close()
      except Exception:
        if not self._failed:
          raise

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
