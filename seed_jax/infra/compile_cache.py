"""JAX's persistent compilation cache: compiled programs are written to a folder and read back by later
processes with the same program, JAX version and machine, so a second run (and the test suite's
subprocesses) skip recompiling."""
from __future__ import annotations

import os

import jax

_HITS = "/jax/compilation_cache/cache_hits"
_hits = [0]


def default_dir() -> str:
  """JAX's own JAX_COMPILATION_CACHE_DIR when set, else ~/.cache/seed_jax/jax_compilation_cache."""
  if folder := os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return folder
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "seed_jax", "jax_compilation_cache")


def default_min_compile_time_s() -> float:
  """JAX's own JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS when set, else 1 s."""
  return float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", 1.0))


def enable(folder: str = "", min_compile_time_s: float = -1.0) -> str:
  """Turns the cache on in `folder` ("": default_dir()) for programs that took at least `min_compile_time_s`
  to compile (< 0: default_min_compile_time_s(); cheaper programs are not worth a file read). Returns the
  folder."""
  folder = os.path.abspath(os.path.expanduser(folder or default_dir()))
  if min_compile_time_s < 0:
    min_compile_time_s = default_min_compile_time_s()
  os.makedirs(folder, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return folder


def _count(event: str, **_) -> None:
  if event == _HITS:
    _hits[0] += 1


jax.monitoring.register_event_listener(_count)


def hits() -> int:
  """Programs this process has read from the persistent cache instead of compiling."""
  return _hits[0]
