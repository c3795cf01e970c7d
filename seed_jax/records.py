"""JSONL record files (Stage 1's trajectories and annotations, the warm start's records, the eval stage's
episodes, a run's metrics).

Appends are one O_APPEND write followed by fsync; a file written at once goes through a temporary file and a
rename. On reading, a last line without its newline is a torn write (a crash mid-append): it is ignored, and
with `repair` cut off, so the next append starts on a clean line.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, Iterable, Sequence

log = logging.getLogger(__name__)


def append_records(path: str, records: Sequence[dict]) -> None:
  """Appends `records` as JSON lines with one O_APPEND write (looped only if the OS writes part), then fsync."""
  data = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records).encode()
  if not data:
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    view = memoryview(data)
    while view:
      view = view[os.write(fd, view):]
    os.fsync(fd)
  finally:
    os.close(fd)


def write_records(path: str, records: Iterable[dict]) -> None:
  """Writes `records` as the whole file at once (temporary file + rename): a reader never sees half of it."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r, ensure_ascii=False) + "\n")
  os.replace(tmp, path)


def read_records(path: str, repair: bool = False) -> list[dict]:
  """The complete lines of a JSONL file ([] if it does not exist). A last line without its newline is a torn
  write: it is ignored, and with `repair` cut off the file so later appends start on a clean line. A broken
  line in the middle is an error naming the line."""
  if not os.path.exists(path):
    return []
  with open(path, "rb") as f:
    data = f.read()
  end = data.rfind(b"\n") + 1
  if end < len(data):
    log.warning("%s: ignoring a torn last line of %d bytes", path, len(data) - end)
    if repair:
      with open(path, "r+b") as f:
        f.truncate(end)
        os.fsync(f.fileno())
  out = []
  for n, line in enumerate(data[:end].splitlines(), 1):
    if line.strip():
      try:
        out.append(json.loads(line))
      except ValueError as e:
        raise ValueError(f"{path}: line {n} is not valid JSON ({e}); the file is corrupt") from None
  return out


def unique(records: Iterable[dict], key: Callable[[dict], Any]) -> dict[Any, dict]:
  """The records by `key`; of several with the same key the first wins (a record appended twice counts once)."""
  out: dict[Any, dict] = {}
  for r in records:
    out.setdefault(key(r), r)
  return out
