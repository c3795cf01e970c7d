"""JAX's persistent compilation cache: compiled programs are written to a folder and read back by later
processes with the same program, JAX version and machine, so a second run (and the test suite's
subprocesses) skip recompiling."""
from __future__ import annotations

import os

import jax

try:
  from jax._src import cache_key  # the key's device part (_key_cpu_programs_by_device_kind)
except ImportError:  # a JAX without it keeps its own key
  cache_key = None

from seed_jax.infra import machine

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
  _key_cpu_programs_by_device_kind()
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return folder


def _key_cpu_programs_by_device_kind() -> None:
  """JAX keys a program partly by its devices' topology, whose CPU fingerprint holds the process index, and
  only process 0 writes entries: the other processes of a multi-process CPU job (the tests' pods) missed every
  entry and compiled every program again. Such jobs key CPU programs here by their devices' kinds and the
  host CPU's model and instruction sets (what the topology adds: the compiled code's target); the device
  assignment and sharding stay in the key through the compile options and the program, so every process reads
  what process 0 wrote. One-process jobs, other platforms, hosts without /proc/cpuinfo and a JAX without this
  hook keep JAX's own key."""
  hook = getattr(cache_key, "_hash_accelerator_config", None)
  cpu = machine.cpu_fields()
  if hook is None or getattr(hook, "_seed_jax", False) or not hasattr(cache_key, "_hash_devices") or not cpu:
    return
  host = "\n".join(f"{k}: {v}" for k, v in sorted(cpu.items()))

  def keyed(hash_obj, devices, *rest):
    if jax.process_count() > 1 and all(d.platform == "cpu" for d in devices.flat):
      cache_key._hash_devices(hash_obj, devices)
      hash_obj.update(host.encode())
    else:
      hook(hash_obj, devices, *rest)

  keyed._seed_jax = True
  cache_key._hash_accelerator_config = keyed


def _count(event: str, **_) -> None:
  if event == _HITS:
    _hits[0] += 1


jax.monitoring.register_event_listener(_count)


def hits() -> int:
  """Programs this process has read from the persistent cache instead of compiling."""
  return _hits[0]
