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
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import traceback
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import orbax.checkpoint as ocp

_MISSING = "<missing>"


class IncompatibleCheckpointError(ValueError):
  pass


class CheckpointWriteError(RuntimeError):
  """An asynchronous save failed; its message is one line: the step, the folder, the cause, what is saved."""


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
  closed; each prints an unraisable 'Event loop is closed' traceback. Those alone are dropped."""
  def hook(u):
    if not (isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed"):
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
    """The stored {"fingerprint": ..., "metadata": ...} of `step` (default: latest)."""
    step = self._check_step(step)
    return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def restore(self, step: int | None, abstract: Any) -> tuple[Any, dict[str, Any]]:
    """(state, metadata) of `step` (None: latest). `abstract` is a pytree of jax.ShapeDtypeStruct whose
    shardings decide where every restored array lives (any mesh, so a run can resume on another layout)."""
    step = self._check_step(step)
    meta = self.restore_metadata(step)
    if self.fingerprint is not None:
      diffs = fingerprint_diff(meta.get("fingerprint") or {}, self.fingerprint)
      if diffs:
        raise IncompatibleCheckpointError(
            f"checkpoint {self.directory} step {step} does not match the current config: " + "; ".join(diffs))
    restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
    return restored["state"], meta["metadata"]

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
